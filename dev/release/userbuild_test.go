package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

var noRewrite = flag.Bool("norewrite", false,
	"pack the modules with their go.mod files as the repository holds them, without the release's rewrite "+
		"(TestUserBuild then fails: the zero pseudo-version cannot be served)")

// ourModules matches every module of this repository, for GONOSUMDB:
// a pretend version has no entry in the checksum database.
const ourModules = "github.com/watermill-dedup/*"

// maxQuickStartModules bounds the Quick start's module graph (`go list -m
// all`): the root module and stores/redis must stay cheap to depend on.
const maxQuickStartModules = 40

// goTimeout bounds each go command the test runs.
const goTimeout = 3 * time.Minute

// repoRoot is the nearest folder above the working directory that holds
// go.work.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.work above the working directory")
		}
		dir = parent
	}
}

// TestUserBuild builds what users build, the way they get it: every module
// a release would tag, packed from the working tree (with the release's
// go.mod rewrite applied to a copy, at a pretend version) into a
// file-system module proxy, and fresh modules outside the workspace, with
// no replace directive, that depend on them: the README's Quick start, a
// DynamoDB consumer, a Lambda handler, and `go install …/cmd/dedupctl@v`.
//
// Nothing but the disk is reached. GOPROXY lists only file:// proxies: the
// packed modules, then the module cache's download folder, which the
// workspace's build filled, for third-party modules. Third-party checksums
// come from go.sum: each fresh module's go.sum is seeded with every line
// of the repository's go.sum files (the hashes the workspace's build
// verified), and our modules are in GONOSUMDB (a pretend version is in no
// checksum database). A lookup in the checksum database would still be
// attempted for a module that no go.sum of the repository names; the
// HTTP(S) proxy variables point at a closed port, so that lookup fails at
// once, on every machine alike, instead of depending on the network. Only
// `go install pkg@version` needs GOSUMDB=off: it runs outside any module,
// so there is no go.sum to seed.
//
// The module cache is the shared one (GOMODCACHE), so that third-party
// modules are not extracted again and their compiled packages come from
// the build cache, as in the workspace's own build. What enters it is our
// modules at the pretend version, so that version is new on every run
// (v0.0.0-usertest.<nanoseconds>): a later run never finds a stale copy of
// the working tree under its own version, and two runs at once do not
// meet. The test removes its version's files from the cache when it ends;
// a run killed before that leaves them behind, never to be read again
// (`go clean -modcache` removes them).
func TestUserBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("packs every library module and builds four programs: not in -short")
	}
	start := time.Now()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	version := fmt.Sprintf("v0.0.0-usertest.%d", time.Now().UnixNano())
	tmp := t.TempDir()

	// The working tree as a commit would hold it: what git tracks, and the
	// untracked files it does not ignore (not tools/node_modules or a
	// stray binary), with the release's rewrite.
	tree := filepath.Join(tmp, "repo")
	files := copyWorkingTree(t, root, tree)
	p, err := plan(tree, version)
	if err != nil {
		t.Fatal(err)
	}
	if *noRewrite {
		t.Log("-norewrite: the go.mod files as the repository holds them")
	} else if err := p.apply(tree); err != nil {
		t.Fatal(err)
	}
	proxy := filepath.Join(tmp, "proxy")
	for _, e := range p.Edits {
		packModule(t, proxy, e.Module, version, filepath.Join(tree, filepath.FromSlash(e.Module.Dir)))
	}
	sums := goSumLines(t, root, files)
	t.Logf("packed %d modules at %s in %v", len(p.Edits), version, time.Since(start).Round(time.Millisecond))

	modCache := strings.TrimSpace(goOutput(t, root, nil, "env", "GOMODCACHE"))
	if modCache == "" {
		t.Fatal("go env GOMODCACHE is empty")
	}
	env := userEnv(proxy, modCache)
	ours := map[string]bool{}
	for _, e := range p.Edits {
		ours[e.Module.Path] = true
		t.Cleanup(func() {
			if err := removeFromModCache(modCache, e.Module.Path, version); err != nil {
				t.Error(err)
			}
		})
	}

	var quickstartModules int
	t.Run("quickstart", func(t *testing.T) {
		src := readmeQuickStart(t, root)
		dir, get := userModule(t, tmp, "quickstart", src, ours, version, sums)
		runGo(t, dir, env, append([]string{"get"}, get...)...)
		runGo(t, dir, env, "mod", "tidy")
		runGo(t, dir, env, "build", "-o", os.DevNull, ".")
		// -e: the module cache, serving as a proxy, has no .info file for a
		// module of which the go command only ever needed the go.mod; the
		// lines listed are those a user gets from a real proxy.
		out := runGo(t, dir, env, "list", "-m", "-e", "all")
		quickstartModules = len(strings.Split(strings.TrimSpace(out), "\n"))
		t.Logf("go list -m all | wc -l: %d", quickstartModules)
		if quickstartModules > maxQuickStartModules {
			t.Errorf("the Quick start's module graph has %d modules, more than %d:\n%s", quickstartModules, maxQuickStartModules, out)
		}
	})
	t.Run("dynamo", func(t *testing.T) {
		dir, get := userModule(t, tmp, "dynamo", dynamoConsumer, ours, version, sums)
		runGo(t, dir, env, append([]string{"get"}, get...)...)
		runGo(t, dir, env, "mod", "tidy")
		runGo(t, dir, env, "build", "-o", os.DevNull, ".")
	})
	t.Run("lambda", func(t *testing.T) {
		dir, get := userModule(t, tmp, "lambda", lambdaHandler, ours, version, sums)
		runGo(t, dir, env, append([]string{"get"}, get...)...)
		runGo(t, dir, env, "mod", "tidy")
		runGo(t, dir, env, "build", "-o", os.DevNull, ".")
	})
	t.Run("dedupctl", func(t *testing.T) {
		// Outside any module, as a user installs a command; no go.sum to
		// seed, hence GOSUMDB=off (see the test's doc).
		dir := filepath.Join(tmp, "install")
		bin := filepath.Join(tmp, "bin")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		installEnv := append(slices.Clone(env), "GOBIN="+bin, "GOSUMDB=off")
		runGo(t, dir, installEnv, "install", "github.com/watermill-dedup/watermill-dedup/cmd/dedupctl@"+version)
		if _, err := os.Stat(filepath.Join(bin, "dedupctl")); err != nil {
			t.Errorf("go install reported success but left no binary: %v", err)
		}
	})
	t.Logf("user build: %v in all", time.Since(start).Round(time.Millisecond))
}

// userEnv is the environment of a user's go command: no workspace, modules
// only from the file proxies.
func userEnv(proxy, modCache string) []string {
	drop := map[string]bool{}
	for _, k := range []string{
		"GOFLAGS", "GOWORK", "GOPROXY", "GONOPROXY", "GOPRIVATE", "GONOSUMDB", "GONOSUMCHECK", "GOSUMDB",
		"GOINSECURE", "GOMODCACHE", "GOBIN", "GOTOOLCHAIN", "GOVCS",
		"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy", "no_proxy",
	} {
		drop[k] = true
	}
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if !drop[k] {
			env = append(env, kv)
		}
	}
	const closed = "http://127.0.0.1:9" // the discard port: nothing listens
	return append(env,
		"GOWORK=off",
		"GOFLAGS=-mod=mod",
		"GOTOOLCHAIN=local",
		"GOPROXY=file://"+filepath.ToSlash(proxy)+",file://"+filepath.ToSlash(filepath.Join(modCache, "cache", "download")),
		"GONOSUMDB="+ourModules,
		"GOMODCACHE="+modCache,
		"HTTP_PROXY="+closed, "HTTPS_PROXY="+closed, "http_proxy="+closed, "https_proxy="+closed,
	)
}

// removeFromModCache removes module modPath at version from the module
// cache: the extracted folder (read-only, as the go command leaves it), the
// downloaded files, the version's line in the download folder's list (which
// the go command keeps for a cache used as a proxy), and the folders this
// leaves empty.
func removeFromModCache(modCache, modPath, version string) error {
	escPath, err := module.EscapePath(modPath)
	if err != nil {
		return err
	}
	escVersion, err := module.EscapeVersion(version)
	if err != nil {
		return err
	}
	var errs []error
	dir := filepath.Join(modCache, filepath.FromSlash(escPath)+"@"+escVersion)
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			errs = append(errs, os.Chmod(p, 0o755))
		}
		return nil
	})
	errs = append(errs, os.RemoveAll(dir))
	removeEmptyDirs(filepath.Dir(dir), modCache)

	download := filepath.Join(modCache, "cache", "download")
	at := filepath.Join(download, filepath.FromSlash(escPath), "@v")
	files, err := filepath.Glob(filepath.Join(at, escVersion+".*"))
	errs = append(errs, err)
	for _, f := range files {
		errs = append(errs, os.Remove(f))
	}
	if list, err := os.ReadFile(filepath.Join(at, "list")); err == nil {
		var keep []string
		for _, v := range strings.Fields(string(list)) {
			if v != version {
				keep = append(keep, v)
			}
		}
		if len(keep) == 0 {
			errs = append(errs, os.Remove(filepath.Join(at, "list")))
		} else {
			errs = append(errs, os.WriteFile(filepath.Join(at, "list"), []byte(strings.Join(keep, "\n")+"\n"), 0o644))
		}
	}
	removeEmptyDirs(at, download)
	return errors.Join(errs...)
}

// removeEmptyDirs removes dir and its parents below stop while they are
// empty (os.Remove refuses a folder that is not).
func removeEmptyDirs(dir, stop string) {
	for dir != stop && strings.HasPrefix(dir, stop+string(filepath.Separator)) {
		if os.Remove(dir) != nil {
			return
		}
		dir = filepath.Dir(dir)
	}
}

// copyWorkingTree copies the files git would commit with `git add -A` (the
// tracked ones still present and the untracked ones not ignored) from root
// to dst, and returns their slash-separated paths.
func copyWorkingTree(t *testing.T, root, dst string) []string {
	t.Helper()
	out, err := git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	if err != nil {
		t.Fatalf("the user-build test needs a git checkout: %v", err)
	}
	var files []string
	for _, rel := range strings.Split(out, "\x00") {
		if rel == "" {
			continue
		}
		src := filepath.Join(root, filepath.FromSlash(rel))
		info, err := os.Lstat(src)
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted in the work tree
		}
		if err != nil {
			t.Fatal(err)
		}
		if !info.Mode().IsRegular() {
			continue
		}
		if slices.Contains(files, rel) {
			continue
		}
		files = append(files, rel)
		target := filepath.Join(dst, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := copyFile(src, target, info.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
	return files
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// packModule lays module m at version out in proxy as the GOPROXY protocol
// wants it: <escaped path>/@v/list, .info, .mod and .zip. The zip holds
// the module's folder without its nested modules (zip.CreateFromDir).
func packModule(t *testing.T, proxy string, m repoModule, version, dir string) {
	t.Helper()
	escPath, err := module.EscapePath(m.Path)
	if err != nil {
		t.Fatal(err)
	}
	escVersion, err := module.EscapeVersion(version)
	if err != nil {
		t.Fatal(err)
	}
	at := filepath.Join(proxy, filepath.FromSlash(escPath), "@v")
	if err := os.MkdirAll(at, 0o755); err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, time.Now().UTC().Truncate(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		"list":               []byte(version + "\n"),
		escVersion + ".info": info,
		escVersion + ".mod":  gomod,
	} {
		if err := os.WriteFile(filepath.Join(at, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	zf, err := os.Create(filepath.Join(at, escVersion+".zip"))
	if err != nil {
		t.Fatal(err)
	}
	if err := modzip.CreateFromDir(zf, module.Version{Path: m.Path, Version: version}, dir); err != nil {
		zf.Close()
		t.Fatalf("packing %s: %v", m.Dir, err)
	}
	if err := zf.Close(); err != nil {
		t.Fatal(err)
	}
}

// goSumLines returns every line of the repository's go.sum files (and
// go.work.sum) about a module that is not ours, without duplicates.
func goSumLines(t *testing.T, root string, files []string) []string {
	t.Helper()
	seen := map[string]bool{}
	var lines []string
	for _, rel := range files {
		if base := path.Base(rel); base != "go.sum" && base != "go.work.sum" {
			continue
		}
		data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if line == "" || seen[line] || strings.HasPrefix(line, "github.com/watermill-dedup/") {
				continue
			}
			seen[line] = true
			lines = append(lines, line)
		}
	}
	slices.Sort(lines)
	return lines
}

// userModule writes a fresh module, example.com/userbuild/<name>, in its
// own folder: main.go holding src, a go.mod with no requirement and a
// go.sum seeded with sums. It returns the folder and the arguments of the
// user's `go get`: each of our modules src imports, at version, except the
// root module when src imports another of ours, which must bring the root
// module with it (as `go get …/stores/redis@v` alone does).
func userModule(t *testing.T, tmp, name, src string, ours map[string]bool, version string, sums []string) (string, []string) {
	t.Helper()
	dir := filepath.Join(tmp, "user", name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := parser.ParseFile(token.NewFileSet(), "main.go", src, parser.ImportsOnly)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	rootPath := ""
	for mp := range ours {
		if rootPath == "" || len(mp) < len(rootPath) {
			rootPath = mp
		}
	}
	required := map[string]bool{}
	for _, imp := range f.Imports {
		p, err := strconv.Unquote(imp.Path.Value)
		if err != nil {
			t.Fatal(err)
		}
		// The module providing p: the longest of our module paths that is
		// p or a prefix of it.
		best := ""
		for mp := range ours {
			if (p == mp || strings.HasPrefix(p, mp+"/")) && len(mp) > len(best) {
				best = mp
			}
		}
		if best != "" {
			required[best] = true
		}
	}
	if len(required) > 1 {
		delete(required, rootPath)
	}
	var get []string
	for mp := range required {
		get = append(get, mp+"@"+version)
	}
	slices.Sort(get)
	for file, data := range map[string]string{
		"main.go": src,
		"go.mod":  fmt.Sprintf("module example.com/userbuild/%s\n\ngo 1.26.0\n", name),
		"go.sum":  strings.Join(sums, "\n") + "\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir, get
}

// readmeQuickStart returns the README's Quick start program: the first
// ```go block after the "## Quick start" heading, read now so that the
// test and the README never drift.
func readmeQuickStart(t *testing.T, root string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## Quick start\n")
	if !ok {
		t.Fatal(`README.md has no "## Quick start" section`)
	}
	if next := strings.Index(section, "\n## "); next >= 0 {
		section = section[:next]
	}
	_, block, ok := strings.Cut(section, "\n```go\n")
	if !ok {
		t.Fatal("README.md's Quick start has no ```go block")
	}
	code, _, ok := strings.Cut(block, "\n```\n")
	if !ok {
		t.Fatal("README.md's Quick start go block does not end")
	}
	return code + "\n"
}

// runGo runs the go command in dir with env, bounded by goTimeout, and
// fails the test with the command's output when it fails.
func runGo(t *testing.T, dir string, env []string, args ...string) string {
	t.Helper()
	start := time.Now()
	out, err := goCommand(dir, env, args...)
	if err != nil {
		t.Fatalf("go %s (in %s, %v): %v\n%s", strings.Join(args, " "), dir, time.Since(start).Round(time.Millisecond), err, out)
	}
	t.Logf("go %s: %v", strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
	return out
}

// goOutput is runGo for a command that needs no special environment.
func goOutput(t *testing.T, dir string, env []string, args ...string) string {
	t.Helper()
	out, err := goCommand(dir, env, args...)
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func goCommand(dir string, env []string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), goTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("timed out after %v: %w", goTimeout, err)
	}
	return out.String(), err
}

// dynamoConsumer is a user's DynamoDB consumer: a store on a table, with a
// client from the default AWS configuration, and the middleware. It is
// built, not run.
const dynamoConsumer = `package main

import (
	"context"
	"log"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/stores/dynamo"
)

func main() {
	ctx := context.Background()
	awsConfig, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		log.Fatal(err)
	}
	store, err := dynamo.New(ctx, dynamo.Config{Client: dynamodb.NewFromConfig(awsConfig), Table: "dedup"})
	if err != nil {
		log.Fatal(err)
	}
	d, err := dedup.New(dedup.Config{Store: store, Key: keyfuncs.JSON("order_id"), Lease: 30 * time.Second, Retention: 24 * time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	_ = d.Middleware // router.AddMiddleware(d.Middleware)
}
`

// lambdaHandler is a user's Lambda function on an SQS event source.
const lambdaHandler = `package main

import (
	"context"
	"log"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-lambda-go/lambda"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/lambdadedup"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

func main() {
	store, err := memory.New(context.Background(), memory.Config{}) // a shared store in production
	if err != nil {
		log.Fatal(err)
	}
	h, err := lambdadedup.New(lambdadedup.Config{
		Dedup: dedup.Config{Store: store, Key: keyfuncs.JSON("order_id"), Scope: "charge-orders"},
	}, func(msg *message.Message) error {
		return nil // the effect
	})
	if err != nil {
		log.Fatal(err)
	}
	lambda.Start(h.Handle)
}
`
