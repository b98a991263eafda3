package main

import (
	"bytes"
	"fmt"
	"github.com/watermill-dedup/watermill-dedup/dev/apidump/api"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
)

// libraryModules are the directories, relative to the repository root, of
// the modules users depend on: api.LibraryModules, the only list of them,
// which the API check (dev/apidump) reads too. A release tags these and
// every repository module they require (found in their go.mod files,
// transitively); the user-build test packs the same set. Every other
// module of go.work (docs, examples, reliability, ops, dev, …) is tooling:
// never released, free to keep its replace directives, and required by no
// library module.
var libraryModules = api.LibraryModules

// toolingDir is the folder of this command's own module; a release that
// would include it (a library module requiring it) is refused.
const toolingDir = "dev"

// repoModule is one module of go.work.
type repoModule struct {
	Dir  string // slash-separated, relative to the repository root; "." for the root
	Path string // module path
}

// tag returns the tag that gives module m the version v, per Go's rule for
// a module in a subdirectory of its repository.
func (m repoModule) tag(v string) string {
	if m.Dir == "." {
		return v
	}
	return m.Dir + "/" + v
}

// edit is one released module's go.mod, before and after the release's
// rewrite.
type edit struct {
	Module   repoModule
	Why      string // "library module" or which module requires it
	Old, New []byte
	Changes  []string // one line per requirement set and replace dropped
}

// releasePlan is everything a release of Version does, computed from the
// repository at Root without changing it.
type releasePlan struct {
	Root    string
	Version string
	Edits   []edit // the released modules, the root module first, then by folder
}

// workspaceModules reads go.work's use list and each module's path.
func workspaceModules(root string) ([]repoModule, error) {
	data, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		return nil, err
	}
	wf, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		return nil, err
	}
	var mods []repoModule
	for _, u := range wf.Use {
		dir := path.Clean(filepath.ToSlash(u.Path))
		if path.IsAbs(dir) || dir == ".." || strings.HasPrefix(dir, "../") {
			return nil, fmt.Errorf("go.work: %s is outside the repository", u.Path)
		}
		gomod := filepath.Join(root, filepath.FromSlash(dir), "go.mod")
		data, err := os.ReadFile(gomod)
		if err != nil {
			return nil, err
		}
		mp := modfile.ModulePath(data)
		if mp == "" {
			return nil, fmt.Errorf("%s: no module line", gomod)
		}
		mods = append(mods, repoModule{Dir: dir, Path: mp})
	}
	return mods, nil
}

// plan computes the release of version from the repository at root: which
// modules are released (libraryModules and the repository modules they
// require, transitively), each one's rewritten go.mod, and its tag.
func plan(root, version string) (*releasePlan, error) {
	if !semver.IsValid(version) || semver.Canonical(version) != version {
		return nil, fmt.Errorf("version %q is not a canonical semantic version (vX.Y.Z or vX.Y.Z-pre, no +build)", version)
	}
	mods, err := workspaceModules(root)
	if err != nil {
		return nil, err
	}
	byPath := map[string]repoModule{}
	byDir := map[string]repoModule{}
	for _, m := range mods {
		byPath[m.Path] = m
		byDir[m.Dir] = m
	}
	rootMod, ok := byDir["."]
	if !ok {
		return nil, fmt.Errorf("go.work does not use the root module (.)")
	}

	// The released set: the library modules, then whatever repository
	// module a released module's go.mod requires.
	why := map[string]string{}
	var queue []repoModule
	for _, dir := range libraryModules {
		m, ok := byDir[dir]
		if !ok {
			return nil, fmt.Errorf("library module %s is not in go.work's use list", dir)
		}
		why[m.Dir] = "library module"
		queue = append(queue, m)
	}
	files := map[string][]byte{}
	for len(queue) > 0 {
		m := queue[0]
		queue = queue[1:]
		data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(m.Dir), "go.mod"))
		if err != nil {
			return nil, err
		}
		files[m.Dir] = data
		f, err := modfile.Parse(m.Dir+"/go.mod", data, nil)
		if err != nil {
			return nil, err
		}
		for _, r := range f.Require {
			dep, ok := byPath[r.Mod.Path]
			if !ok {
				if strings.HasPrefix(r.Mod.Path, rootMod.Path+"/") {
					return nil, fmt.Errorf("%s/go.mod requires %s, which is no module of go.work", m.Dir, r.Mod.Path)
				}
				continue
			}
			if _, seen := why[dep.Dir]; !seen {
				why[dep.Dir] = "required by " + m.Dir
				queue = append(queue, dep)
			}
		}
	}

	p := &releasePlan{Root: root, Version: version}
	dirs := make([]string, 0, len(why))
	for dir := range why {
		dirs = append(dirs, dir)
	}
	slices.SortFunc(dirs, func(a, b string) int {
		if (a == ".") != (b == ".") {
			if a == "." {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	for _, dir := range dirs {
		m := byDir[dir]
		if dir == toolingDir || strings.HasPrefix(dir, toolingDir+"/") {
			return nil, fmt.Errorf("%s is tooling and cannot be released, but it is %s", dir, why[dir])
		}
		// The go command finds <dir>/vX.Y.Z only for a module whose path is
		// the repository's path plus <dir>.
		if want := path.Join(rootMod.Path, dir); m.Path != want {
			return nil, fmt.Errorf("%s: module path %s is not %s, so the tag %s would not name it", dir, m.Path, want, m.tag(version))
		}
		if err := module.Check(m.Path, version); err != nil {
			return nil, err
		}
		out, changes, err := rewrite(dir+"/go.mod", files[dir], byPath, version)
		if err != nil {
			return nil, err
		}
		p.Edits = append(p.Edits, edit{Module: m, Why: why[dir], Old: files[dir], New: out, Changes: changes})
	}
	return p, nil
}

// rewrite returns the go.mod data with every requirement of a repository
// module (a key of siblings) set to version and every replace directive of
// a repository module dropped, and one line per change. It refuses a go.mod
// that would keep another replace or an exclude: a user's build ignores
// both, so the release would not build as the repository does.
func rewrite(name string, data []byte, siblings map[string]repoModule, version string) ([]byte, []string, error) {
	f, err := modfile.Parse(name, data, nil)
	if err != nil {
		return nil, nil, err
	}
	var changes []string
	// Copies: AddRequire and DropReplace change the entries they find.
	var requires []module.Version
	for _, r := range f.Require {
		requires = append(requires, r.Mod)
	}
	var replaces []modfile.Replace
	for _, r := range f.Replace {
		replaces = append(replaces, *r)
	}
	for _, r := range requires {
		if _, ok := siblings[r.Path]; !ok || r.Version == version {
			continue
		}
		if err := f.AddRequire(r.Path, version); err != nil {
			return nil, nil, err
		}
		changes = append(changes, fmt.Sprintf("require %s %s => %s", r.Path, r.Version, version))
	}
	var kept []string
	for _, r := range replaces {
		if _, ok := siblings[r.Old.Path]; !ok {
			kept = append(kept, fmt.Sprintf("replace %s", r.Old.Path))
			continue
		}
		if err := f.DropReplace(r.Old.Path, r.Old.Version); err != nil {
			return nil, nil, err
		}
		changes = append(changes, fmt.Sprintf("drop replace %s => %s", r.Old.Path, strings.TrimSpace(r.New.Path+" "+r.New.Version)))
	}
	for _, x := range f.Exclude {
		kept = append(kept, fmt.Sprintf("exclude %s %s", x.Mod.Path, x.Mod.Version))
	}
	if len(kept) > 0 {
		return nil, nil, fmt.Errorf("%s: a user's build ignores %s; remove it before a release", name, strings.Join(kept, ", "))
	}
	f.Cleanup()
	out, err := f.Format()
	if err != nil {
		return nil, nil, err
	}
	return out, changes, nil
}

// apply writes every rewritten go.mod under root (the repository, or a
// copy of it).
func (p *releasePlan) apply(root string) error {
	for _, e := range p.Edits {
		if err := os.WriteFile(filepath.Join(root, filepath.FromSlash(e.Module.Dir), "go.mod"), e.New, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// tags returns the release's tags, in the order of Edits.
func (p *releasePlan) tags() []string {
	var tags []string
	for _, e := range p.Edits {
		tags = append(tags, e.Module.tag(p.Version))
	}
	return tags
}

// print writes the go.mod edits and the tags.
func (p *releasePlan) print(w io.Writer) {
	fmt.Fprintf(w, "release %s: %d modules\n\n", p.Version, len(p.Edits))
	for _, e := range p.Edits {
		fmt.Fprintf(w, "%s (%s, %s)\n", path.Join(e.Module.Dir, "go.mod"), e.Module.Path, e.Why)
		if bytes.Equal(e.Old, e.New) {
			fmt.Fprintln(w, "\tunchanged")
		}
		for _, c := range e.Changes {
			fmt.Fprintf(w, "\t%s\n", c)
		}
	}
	fmt.Fprintf(w, "\ncommit %q, then tag it:\n", "release "+p.Version)
	for _, t := range p.tags() {
		fmt.Fprintf(w, "\t%s\n", t)
	}
	fmt.Fprintf(w, "then commit %q: every go.mod as it is now\n", backToDevelopment(p.Version))
}

func backToDevelopment(version string) string {
	return "back to development after " + version
}
