// Command release makes a release of watermill-dedup: every library module
// of the repository at one version, with the tags Go's module proxies look
// for. Run it from the repository root:
//
//	go run ./dev/release -version v0.1.0 -dry-run   # print the edits and the tags, change nothing
//	go run ./dev/release -version v0.1.0            # commit, tag, and go back to development
//
// # What a user's build needs
//
// A user's build ignores go.work and every replace directive of a
// dependency: it finds each module of this repository that a library
// module requires at the version that go.mod names, through a module
// proxy, by the module's tag. Between releases the repository's go.mod
// files name no such version (see "Between releases" below), so a release
// rewrites them:
//
//  1. In every released module (the library modules of libraryModules, and
//     every repository module one of them requires, transitively, read from
//     the go.mod files: today internal/redisbatch, required by
//     stores/redis, and internal/cmdenv, required by cmd/dedupctl), each
//     requirement of a repository module is set to the release's version
//     (golang.org/x/mod/modfile edits the files).
//  2. The replace directives that point at repository modules are removed:
//     `go install …/cmd/dedupctl@v0.1.0` refuses a module that has any.
//     The command refuses to release a module that keeps another replace
//     or an exclude, which a user's build would silently ignore.
//  3. The edits are committed as "release vX.Y.Z" and that commit gets one
//     annotated tag per released module: vX.Y.Z for the root module and
//     <dir>/vX.Y.Z for a module in a subdirectory (stores/redis/v0.1.0,
//     …), which is where the go command looks for a version of a module
//     whose path is the repository's path plus <dir>.
//  4. A second commit, "back to development after vX.Y.Z", puts every
//     go.mod back as it was before step 1.
//
// Nothing is pushed; the command prints the git push that publishes the
// release. It refuses a version that is not a canonical semantic version
// (vX.Y.Z or vX.Y.Z-pre), a version a module path cannot take (v2 and
// above need a /v2 path), a work tree with changes or untracked files, and
// a tag that exists already.
//
// # Between releases
//
// Outside a release commit, every module's requirement of another module
// of this repository says v0.0.0-00010101000000-000000000000 and a replace
// directive points it at the sibling's directory. That is the development
// state: with go.work (`use` resolves a workspace module whatever version a
// go.mod names) and without it (GOWORK=off builds and `go mod tidy` use the
// replace), every module builds against the siblings of the same checkout,
// offline, never against an older release that lacks what the checkout
// added. The cost: a commit between releases cannot be fetched by users
// (`go get …@main` fails on the zero version), only a tag can. A go.mod that
// named the last release instead would make GOWORK=off builds fetch that
// release from the network and break on every API added since; the next
// release rewrites the requirement anyway.
//
// The user-build test (userbuild_test.go, part of `make test`) applies this
// rewrite to a copy of the working tree at a pretend version, serves every
// released module from a file-system module proxy and builds the README's
// Quick start, a DynamoDB consumer, a Lambda handler and
// `go install …/cmd/dedupctl@version` in fresh modules with no replace and
// no workspace, as a user would.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	version := fs.String("version", "", "the version to release, vX.Y.Z or vX.Y.Z-pre (required)")
	dryRun := fs.Bool("dry-run", false, "print the go.mod edits and the tags, change nothing")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if *version == "" {
		return errors.New("-version is required, e.g. -version v0.1.0")
	}
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	if _, err := os.Stat(root + "/go.work"); err != nil {
		return fmt.Errorf("run from the repository root (the folder of go.work): %w", err)
	}
	p, err := plan(root, *version)
	if err != nil {
		return err
	}
	if *dryRun {
		p.print(stdout)
		fmt.Fprintln(stdout, "dry run: nothing changed")
		return nil
	}
	return p.commitAndTag(stdout)
}
