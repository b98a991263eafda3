package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/watermill-dedup/watermill-dedup/dev/apidump/api"
)

// TestAPIFilesMatchTheCode fails while a library module's exported API
// differs from its committed api.txt: an API change must show as a diff of
// that file (`make api` rewrites it) and a CHANGELOG.md entry.
func TestAPIFilesMatchTheCode(t *testing.T) {
	root, err := api.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, mod := range api.LibraryModules {
		lines, _, err := api.Module(filepath.Join(root, mod))
		if err != nil {
			t.Fatalf("%s: %v", mod, err)
		}
		if len(lines) == 0 {
			t.Fatalf("%s: no exported API found", mod)
		}
		want := []byte(strings.Join(lines, "\n") + "\n")
		got, err := os.ReadFile(filepath.Join(root, mod, "api.txt"))
		if err != nil {
			t.Fatalf("%s: %v (run `make api`)", mod, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s/api.txt differs from the code (review, then `make api` and a CHANGELOG.md entry):\n%s", mod, api.Diff(string(got), string(want)))
		}
	}
}

// TestModuleLinesCatchAChange checks that the listing sees what a user
// sees: a new exported function, field and method each add a line, an
// unexported one adds none, and test files do not count.
func TestModuleLinesCatchAChange(t *testing.T) {
	dir := t.TempDir()
	write := func(name, src string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/m\n\ngo 1.26.0\n")
	write("m.go", `package m

import "time"

type Config struct {
	Lease time.Duration
	hidden int
}

type Store interface {
	Claim(key string) (bool, error)
}

func (c Config) Validate() error { return nil }
func (c Config) check() error    { return nil }

var ErrX = errorsNew("x")

func errorsNew(s string) error { return nil }

const Default = 3 * time.Second

func New[T any](c Config, opts ...T) (*Config, error) { return nil, nil }
`)
	write("m_test.go", "package m\n\nfunc TestOnly() {}\n")
	lines, counts, err := api.Module(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"pkg example.com/m, const Default = 3 * time.Second",
		"pkg example.com/m, func New[T any](Config, ...T) (*Config, error)",
		"pkg example.com/m, method (Config) Validate() error",
		"pkg example.com/m, type Config struct",
		"pkg example.com/m, type Config struct, Lease time.Duration",
		"pkg example.com/m, type Store interface",
		"pkg example.com/m, type Store interface, Claim(string) (bool, error)",
		"pkg example.com/m, var ErrX = errorsNew(\"x\")",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("lines:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	// Config, Store, Validate, ErrX, Default, New.
	if n := counts["example.com/m"]; n != 6 {
		t.Fatalf("count %d, want 6", n)
	}
}
