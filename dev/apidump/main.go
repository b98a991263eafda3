// Command apidump writes down the exported API of each library module of
// this repository, one line per exported name, in the style of Go's own
// api/*.txt: `pkg dedup, func New(Config) (*Deduplicator, error)`. Each
// library module keeps its list in api.txt at the module's root; the test
// of this package fails while a module's code and its api.txt differ, so
// that every change of the API is a visible diff in review.
//
//	go run ./dev/apidump            # compare, exit 1 on a difference
//	go run ./dev/apidump -write     # rewrite every api.txt
//	go run ./dev/apidump -count     # exported names per package
//
// The lines come from the source (go/ast), types as written there:
// top-level functions, types, constants and variables; the exported
// fields of exported struct types; the methods of exported interfaces; the
// exported methods of exported types. Test files, internal/ and nested
// modules are left out.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/watermill-dedup/watermill-dedup/dev/apidump/api"
)

func main() {
	write := flag.Bool("write", false, "rewrite each module's api.txt instead of comparing")
	count := flag.Bool("count", false, "print the number of exported names of each package")
	flag.Parse()
	root, err := api.RepoRoot()
	if err != nil {
		fail(err)
	}
	differ := false
	for _, mod := range api.LibraryModules {
		dir := filepath.Join(root, mod)
		lines, counts, err := api.Module(dir)
		if err != nil {
			fail(err)
		}
		if *count {
			pkgs := make([]string, 0, len(counts))
			for p := range counts {
				pkgs = append(pkgs, p)
			}
			sort.Strings(pkgs)
			for _, p := range pkgs {
				fmt.Printf("%4d %s\n", counts[p], p)
			}
			continue
		}
		want := []byte(strings.Join(lines, "\n") + "\n")
		file := filepath.Join(dir, "api.txt")
		if *write {
			if err := os.WriteFile(file, want, 0o644); err != nil {
				fail(err)
			}
			continue
		}
		got, err := os.ReadFile(file)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			fail(err)
		}
		if !bytes.Equal(got, want) {
			differ = true
			fmt.Fprintf(os.Stderr, "%s differs from the code:\n%s", filepath.Join(mod, "api.txt"), api.Diff(string(got), string(want)))
		}
	}
	if differ {
		fail(errors.New("the API changed: review the lines above, then run `make api` and add the change to CHANGELOG.md"))
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "apidump:", err)
	os.Exit(1)
}
