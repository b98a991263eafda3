package main

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const siblingGoMod = `module example.com/repo/stores/kv

go 1.26.0

require (
	example.com/other v1.2.3
	example.com/repo v0.0.0-00010101000000-000000000000
)

require example.com/repo/internal/batch v0.0.0-00010101000000-000000000000 // indirect

// The modules of this repository, from this checkout.
replace (
	example.com/repo => ../..
	example.com/repo/internal/batch => ../../internal/batch
)
`

// The rewrite sets every sibling requirement to the version, keeps the
// others and the // indirect marks, and leaves no replace block or its
// comment behind.
func TestRewrite(t *testing.T) {
	siblings := map[string]repoModule{
		"example.com/repo":                {Dir: ".", Path: "example.com/repo"},
		"example.com/repo/internal/batch": {Dir: "internal/batch", Path: "example.com/repo/internal/batch"},
	}
	out, changes, err := rewrite("go.mod", []byte(siblingGoMod), siblings, "v1.4.0")
	if err != nil {
		t.Fatal(err)
	}
	want := `module example.com/repo/stores/kv

go 1.26.0

require (
	example.com/other v1.2.3
	example.com/repo v1.4.0
)

require example.com/repo/internal/batch v1.4.0 // indirect
`
	if string(out) != want {
		t.Errorf("rewritten go.mod:\n%s\nwant:\n%s", out, want)
	}
	if len(changes) != 4 {
		t.Errorf("changes: %q, want 2 requirements and 2 replaces", changes)
	}
}

// A replace of a module that is not a sibling, or an exclude, would be
// ignored by a user's build: the release refuses it.
func TestRewriteRefusesForeignReplace(t *testing.T) {
	for name, extra := range map[string]string{
		"replace": "replace example.com/other => ../other\n",
		"exclude": "exclude example.com/other v1.2.2\n",
	} {
		siblings := map[string]repoModule{"example.com/repo": {Dir: ".", Path: "example.com/repo"}}
		if _, _, err := rewrite("go.mod", []byte(siblingGoMod+extra), siblings, "v1.4.0"); err == nil || !strings.Contains(err.Error(), "ignores") {
			t.Errorf("%s: err = %v, want a refusal", name, err)
		}
	}
}

const fakeRepoPath = "github.com/watermill-dedup/watermill-dedup"

// fakeRepo writes, under a new folder, a go.work and a go.mod for each
// library module and for internal/extra (required by stores/redis), dev and
// docs (tooling, requiring dev), each sibling required at the zero
// pseudo-version with a replace, and returns the folder.
func fakeRepo(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	var use []string
	for _, dir := range append(slices.Clone(libraryModules), "internal/extra", "dev", "docs") {
		use = append(use, "\t./"+dir)
		mp := fakeRepoPath
		if dir != "." {
			mp += "/" + dir
		}
		gomod := "module " + mp + "\n\ngo 1.26.0\n"
		switch dir {
		case "stores/redis":
			gomod += "\nrequire (\n\t" + fakeRepoPath + " " + zeroVersion + "\n\t" + fakeRepoPath + "/internal/extra " + zeroVersion + "\n)\n\n" +
				"// The modules of this repository, from this checkout.\nreplace (\n\t" + fakeRepoPath + " => ../..\n\t" + fakeRepoPath + "/internal/extra => ../../internal/extra\n)\n"
		case "docs":
			gomod += "\nrequire " + fakeRepoPath + "/dev " + zeroVersion + "\n\nreplace " + fakeRepoPath + "/dev => ../dev\n"
		}
		writeFile(t, root, dir+"/go.mod", gomod)
	}
	writeFile(t, root, "go.work", "go 1.26.0\n\nuse (\n"+strings.Join(use, "\n")+"\n)\n")
	return root
}

func writeFile(t *testing.T, root, rel, data string) {
	t.Helper()
	p := filepath.Join(root, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// The released set follows the go.mod files: a library module's
// requirement of a repository module releases that module too, a tooling
// module is not released, and a library module that required the tooling
// module dev is refused.
func TestPlanFollowsRequirements(t *testing.T) {
	root := fakeRepo(t)
	p, err := plan(root, "v0.3.0")
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(p.tags(), " ")
	if !strings.Contains(got, "internal/extra/v0.3.0") || strings.Contains(got, "docs/") || strings.Contains(got, "dev/") {
		t.Errorf("tags %s: want internal/extra (required by stores/redis), not docs or dev", got)
	}
	if p.tags()[0] != "v0.3.0" {
		t.Errorf("first tag %s, want the root module's v0.3.0", p.tags()[0])
	}

	writeFile(t, root, "metrics/go.mod", "module "+fakeRepoPath+"/metrics\n\ngo 1.26.0\n\nrequire "+fakeRepoPath+"/dev "+zeroVersion+"\n")
	if _, err := plan(root, "v0.3.0"); err == nil || !strings.Contains(err.Error(), "tooling") {
		t.Errorf("a library module requiring dev: err = %v, want a refusal", err)
	}
}

// A release in a git repository: refused on a dirty tree; then the
// release commit with the rewritten go.mod files, every tag on it, and a
// commit that puts the go.mod files back; refused again once the tags exist.
func TestCommitAndTag(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	for _, kv := range [][2]string{
		{"GIT_AUTHOR_NAME", "release test"}, {"GIT_AUTHOR_EMAIL", "release@example.com"},
		{"GIT_COMMITTER_NAME", "release test"}, {"GIT_COMMITTER_EMAIL", "release@example.com"},
		{"GIT_CONFIG_GLOBAL", os.DevNull}, {"GIT_CONFIG_NOSYSTEM", "1"},
	} {
		t.Setenv(kv[0], kv[1])
	}
	root := fakeRepo(t)
	mustGit := func(args ...string) string {
		t.Helper()
		out, err := git(root, args...)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(out)
	}
	mustGit("init", "-q", "-b", "main")
	mustGit("add", "-A")
	mustGit("commit", "-q", "-m", "start")
	before := mustGit("rev-parse", "HEAD")
	redisBefore := mustGit("show", "HEAD:stores/redis/go.mod")

	p, err := plan(root, "v0.3.0")
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, root, "notes.txt", "untracked\n")
	if err := p.commitAndTag(io.Discard); err == nil || !strings.Contains(err.Error(), "not clean") {
		t.Fatalf("dirty tree: err = %v, want a refusal", err)
	}
	if err := os.Remove(filepath.Join(root, "notes.txt")); err != nil {
		t.Fatal(err)
	}
	if err := p.commitAndTag(io.Discard); err != nil {
		t.Fatal(err)
	}

	release := mustGit("rev-parse", "HEAD~1")
	if parent := mustGit("rev-parse", "HEAD~2"); parent != before {
		t.Errorf("the release commit's parent is %s, want %s", parent, before)
	}
	if msg := mustGit("log", "-1", "--format=%s", release); msg != "release v0.3.0" {
		t.Errorf("release commit subject %q", msg)
	}
	for _, tag := range p.tags() {
		if at := mustGit("rev-parse", tag+"^{commit}"); at != release {
			t.Errorf("tag %s is on %s, want the release commit %s", tag, at, release)
		}
	}
	released := mustGit("show", release+":stores/redis/go.mod")
	if strings.Contains(released, "replace") || strings.Contains(released, zeroVersion) || !strings.Contains(released, fakeRepoPath+"/internal/extra v0.3.0") {
		t.Errorf("stores/redis/go.mod at the release commit:\n%s", released)
	}
	if now := mustGit("show", "HEAD:stores/redis/go.mod"); now != redisBefore {
		t.Errorf("stores/redis/go.mod after the release:\n%s\nwant as before:\n%s", now, redisBefore)
	}
	if diff := mustGit("diff", before, "HEAD"); diff != "" {
		t.Errorf("the tree after the release differs from before:\n%s", diff)
	}
	if status := mustGit("status", "--porcelain"); status != "" {
		t.Errorf("work tree left dirty:\n%s", status)
	}
	if err := p.commitAndTag(io.Discard); err == nil || !strings.Contains(err.Error(), "tags exist") {
		t.Errorf("second release of v0.3.0: err = %v, want a refusal", err)
	}
}

func TestPlanRefusesVersions(t *testing.T) {
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"0.1.0", "v0.1", "v0.1.0+meta", "v2.0.0"} {
		if _, err := plan(root, v); err == nil {
			t.Errorf("version %s: no error", v)
		}
	}
}
