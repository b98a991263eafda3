package docs_test

import (
	"strings"
	"testing"
)

// The migration guide's "after" block is part of examples/migrating/main.go,
// line for line (indented as the body of its run function), so what the
// page shows is what `go test ./examples/migrating` runs to completion with
// its poison queue, enforcing and in shadow mode, bounded in time.
func TestMigrationGuideIsTheExample(t *testing.T) {
	root := repoRoot(t)
	const page, program = "docs/migrating-from-deduplicator.md", "examples/migrating/main.go"
	m, problems := parseMarkdown(page, readRepoFile(t, root, page))
	for _, p := range problems {
		t.Error(p)
	}
	var after *fence
	for _, b := range m.goBlocks() {
		if strings.HasPrefix(b.code, "d, err := dedup.New(") {
			after = &b
		}
	}
	if after == nil {
		t.Fatalf("%s has no go block starting with d, err := dedup.New(", page)
	}
	var indented strings.Builder
	for _, line := range strings.SplitAfter(after.code, "\n") {
		if strings.TrimSpace(line) != "" {
			indented.WriteString("\t")
		}
		indented.WriteString(line)
	}
	if !strings.Contains(readRepoFile(t, root, program), indented.String()) {
		t.Errorf("%s: the go block at line %d is not part of %s, line for line: copy it from there, or change both", page, after.line, program)
	}
}
