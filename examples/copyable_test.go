// Package examples_test checks that every example folder is a program a
// user can copy out of this module: its non-test files import nothing from
// internal/, and copied alone into a fresh module (with replace directives
// pointing at this tree's modules) it compiles: `go vet` loads and type-checks it with
// every dependency, which is what a build proves, without linking five
// programs (13.5 s against 1.4 s here).
package examples_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
)

func TestExamplesBuildCopiedOutOfTheModule(t *testing.T) {
	root, err := testserver.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go not on PATH: %v", err)
	}
	sum, err := os.ReadFile(filepath.Join(root, "examples", "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile(filepath.Join(root, "examples", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	// The copy requires what the examples' module requires, as a user's
	// module does after `go get`; its replace directives point at the
	// modules of this tree (the examples module's own, made absolute, and
	// the examples module itself, for examples/lambda/esm).
	_, requires, _ := strings.Cut(string(mod), "\nrequire")
	requires, _, _ = strings.Cut(requires, "\n// The modules of this repository")
	replaces := "replace github.com/watermill-dedup/watermill-dedup/examples => " + filepath.Join(root, "examples") + "\n"
	for _, line := range strings.Split(string(mod), "\n") {
		if path, rel, ok := strings.Cut(strings.TrimSpace(line), " => "); ok && strings.HasPrefix(path, "github.com/watermill-dedup/") {
			replaces += "replace " + path + " => " + filepath.Join(root, "examples", rel) + "\n"
		}
	}
	entries, err := os.ReadDir(filepath.Join(root, "examples"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		name := e.Name()
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			copyProgram(t, filepath.Join(root, "examples", name), dir)
			goMod := "module example.com/copied/" + name + "\n\ngo 1.26.0\n\n" +
				"require github.com/watermill-dedup/watermill-dedup/examples v0.0.0\n\n" +
				replaces + "\nrequire" + requires
			if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(goMod), 0o644); err != nil {
				t.Fatal(err)
			}
			// This module's go.sum holds every hash the example needs: the
			// check resolves from the module cache, offline (GOPROXY=off).
			if err := os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644); err != nil {
				t.Fatal(err)
			}
			for _, args := range [][]string{{"vet", "."}} {
				cmd := exec.Command(goBin, args...)
				cmd.Dir = dir
				cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off")
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("go %s in a copy of examples/%s: %v\n%s", strings.Join(args, " "), name, err, out)
				}
			}
		})
	}
}

// copyProgram copies the example's non-test files: what a user takes.
func copyProgram(t *testing.T, from, to string) {
	t.Helper()
	entries, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	copied := 0
	for _, e := range entries {
		if e.IsDir() || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(e.Name(), ".go") && strings.Contains(string(b), "watermill-dedup/internal/") {
			t.Errorf("%s imports a package internal to this module", e.Name())
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
		copied++
	}
	if copied == 0 {
		t.Fatalf("nothing to copy in %s", from)
	}
}
