package main

import (
	"os"
	"path"
	"path/filepath"
	"testing"

	"golang.org/x/mod/modfile"
)

// zeroVersion is what a go.mod names a module of this repository at
// between releases.
const zeroVersion = "v0.0.0-00010101000000-000000000000"

// Between releases every module of go.work requires its siblings at the
// zero pseudo-version and replaces each with the sibling's folder (the
// package doc says why): so GOWORK=off builds and `go mod tidy`
// (scripts/check-modules.sh) resolve them from the same checkout, offline,
// and the release step's rewrite is the only place a real version appears.
func TestBetweenReleases(t *testing.T) {
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	mods, err := workspaceModules(root)
	if err != nil {
		t.Fatal(err)
	}
	byPath := map[string]repoModule{}
	for _, m := range mods {
		byPath[m.Path] = m
	}
	for _, m := range mods {
		name := path.Join(m.Dir, "go.mod")
		data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(name)))
		if err != nil {
			t.Fatal(err)
		}
		f, err := modfile.Parse(name, data, nil)
		if err != nil {
			t.Fatal(err)
		}
		replaced := map[string]string{}
		for _, r := range f.Replace {
			replaced[r.Old.Path] = r.New.Path
		}
		for _, r := range f.Require {
			dep, ok := byPath[r.Mod.Path]
			if !ok {
				continue
			}
			if r.Mod.Version != zeroVersion {
				t.Errorf("%s: requires %s %s; between releases a sibling is required at %s (CONTRIBUTING.md, Releasing)", name, r.Mod.Path, r.Mod.Version, zeroVersion)
			}
			rel, err := filepath.Rel(filepath.FromSlash(m.Dir), filepath.FromSlash(dep.Dir))
			if err != nil {
				t.Fatal(err)
			}
			want := filepath.ToSlash(rel)
			if got, ok := replaced[r.Mod.Path]; !ok {
				t.Errorf("%s: requires %s with no replace; add: replace %s => %s", name, r.Mod.Path, r.Mod.Path, want)
			} else if path.Clean(got) != want {
				t.Errorf("%s: replace %s => %s, want => %s (its folder)", name, r.Mod.Path, got, want)
			}
		}
	}
}
