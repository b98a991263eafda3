package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

// git runs git in dir and returns its standard output.
func git(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("git %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// commitAndTag makes the release in the repository: the rewritten go.mod
// files committed as "release vX.Y.Z", one tag per released module on that
// commit, then a commit that restores every go.mod (the development state,
// see the package doc). It refuses a work tree with changes or untracked
// files and a tag that exists.
func (p *releasePlan) commitAndTag(stdout io.Writer) error {
	status, err := git(p.Root, "status", "--porcelain")
	if err != nil {
		return err
	}
	if status != "" {
		return fmt.Errorf("the work tree is not clean; commit or stash first:\n%s", status)
	}
	var existing []string
	for _, t := range p.tags() {
		if _, err := git(p.Root, "rev-parse", "-q", "--verify", "refs/tags/"+t); err == nil {
			existing = append(existing, t)
		}
	}
	if len(existing) > 0 {
		return fmt.Errorf("tags exist already: %s", strings.Join(existing, " "))
	}

	var files []string
	for _, e := range p.Edits {
		files = append(files, path.Join(e.Module.Dir, "go.mod"))
	}
	if err := p.apply(p.Root); err != nil {
		return errors.Join(err, p.restore())
	}
	if _, err := git(p.Root, append([]string{"add", "--"}, files...)...); err != nil {
		return errors.Join(err, p.restore())
	}
	msg := fmt.Sprintf("release %s\n\nEvery library module and the repository modules they require, at %s:\nrequirements of sibling modules set to %s, their replace directives\nremoved (go run ./dev/release -version %s).\n", p.Version, p.Version, p.Version, p.Version)
	if _, err := git(p.Root, append([]string{"commit", "-q", "-m", msg, "--"}, files...)...); err != nil {
		_, _ = git(p.Root, append([]string{"reset", "-q", "--"}, files...)...)
		return errors.Join(err, p.restore())
	}
	commit, err := git(p.Root, "rev-parse", "HEAD")
	if err != nil {
		return err
	}
	commit = strings.TrimSpace(commit)
	for _, t := range p.tags() {
		if _, err := git(p.Root, "tag", "-a", "-m", "release "+p.Version, t, commit); err != nil {
			return fmt.Errorf("%w\nthe release commit %s is made; tags made so far: git tag -l '*%s'", err, commit, p.Version)
		}
	}
	if err := p.restore(); err != nil {
		return err
	}
	back := fmt.Sprintf("%s\n\nEvery go.mod as before the release commit: requirements of sibling\nmodules at v0.0.0-00010101000000-000000000000 with replace directives\n(CONTRIBUTING.md, Releasing).\n", backToDevelopment(p.Version))
	if _, err := git(p.Root, append([]string{"commit", "-q", "-m", back, "--"}, files...)...); err != nil {
		return fmt.Errorf("%w\nthe release %s is made and tagged; commit the restored go.mod files yourself", err, p.Version)
	}
	branch, _ := git(p.Root, "rev-parse", "--abbrev-ref", "HEAD")
	fmt.Fprintf(stdout, "released %s: commit %s, %d tags; publish with\n\tgit push origin %s %s\n",
		p.Version, commit[:12], len(p.tags()), strings.TrimSpace(branch), strings.Join(p.tags(), " "))
	return nil
}

// restore writes back every go.mod as it was read.
func (p *releasePlan) restore() error {
	var errs []error
	for _, e := range p.Edits {
		errs = append(errs, os.WriteFile(filepath.Join(p.Root, filepath.FromSlash(e.Module.Dir), "go.mod"), e.Old, 0o644))
	}
	return errors.Join(errs...)
}
