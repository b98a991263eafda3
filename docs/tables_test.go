package docs_test

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
)

// delimiterRow is a table's second line: its cells' alignments
// (`| --- | :-: |`), outer pipes optional.
var delimiterRow = regexp.MustCompile(`^\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?$`)

// tableCells splits a table row into its cells as GitHub does: on every
// pipe not escaped with a backslash (a pipe inside a code span splits too:
// write it \|), one leading and one trailing pipe left out.
func tableCells(row string) []string {
	row = strings.TrimSpace(row)
	row = strings.TrimPrefix(row, "|")
	if strings.HasSuffix(row, "|") && !strings.HasSuffix(row, `\|`) {
		row = row[:len(row)-1]
	}
	var cells []string
	start := 0
	for i := 0; i < len(row); i++ {
		switch row[i] {
		case '\\':
			i++ // the escaped character
		case '|':
			cells = append(cells, row[start:i])
			start = i + 1
		}
	}
	return append(cells, row[start:])
}

// tableProblems returns "file:line: …" for each row of the file's tables
// (outside code blocks) whose number of cells differs from its header's.
// GitHub renders such a row silently: a missing cell left empty, an extra
// one dropped with its text. A table is a row with a pipe followed by a
// delimiter row (both with a pipe: a line of dashes alone under text is a
// heading), and runs to the first blank line or line without a pipe.
func (m *markdown) tableProblems() []string {
	var out []string
	lines := m.prose
	for i := 0; i+1 < len(lines); i++ {
		header, delim := strings.TrimSpace(lines[i]), strings.TrimSpace(lines[i+1])
		if !strings.Contains(header, "|") || !strings.Contains(delim, "|") || !delimiterRow.MatchString(delim) {
			continue
		}
		want := len(tableCells(header))
		if n := len(tableCells(delim)); n != want {
			out = append(out, fmt.Sprintf("%s: the table's delimiter row has %d cells, its header %d", m.where(i+2), n, want))
		}
		j := i + 2
		for ; j < len(lines) && strings.TrimSpace(lines[j]) != "" && strings.Contains(lines[j], "|"); j++ {
			if n := len(tableCells(lines[j])); n != want {
				out = append(out, fmt.Sprintf("%s: the table row has %d cells, its header (line %d) %d: a missing or extra | (a | inside a cell is written \\|)", m.where(j+1), n, i+1, want))
			}
		}
		i = j - 1
	}
	return out
}

// Every table row of every Markdown file has as many cells as its header.
func TestMarkdownTablesAreWhole(t *testing.T) {
	root := repoRoot(t)
	tables := 0
	for _, m := range loadRepository(t, root).markdownFiles(t) {
		for _, p := range m.tableProblems() {
			t.Error(p)
		}
		for i := 0; i+1 < len(m.prose); i++ {
			if delim := strings.TrimSpace(m.prose[i+1]); strings.Contains(m.prose[i], "|") && strings.Contains(delim, "|") && delimiterRow.MatchString(delim) {
				tables++
			}
		}
	}
	if tables < 30 {
		t.Errorf("found %d tables in the repository's Markdown; the checker no longer finds them", tables)
	}
	t.Logf("%d tables", tables)
}

// The table checker finds a row with a cell too few (a missing pipe) and a
// row with one too many (a pipe inside a code span, unescaped), and passes
// escaped pipes, tables without outer pipes, and pipes in code blocks.
func TestTableCheckerFails(t *testing.T) {
	const sample = "# Sample\n" + // 1
		"\n" + // 2
		"| store | claim | pick it when |\n" + // 3
		"| --- | --- | :-: |\n" + // 4
		"| memory | a map (0) | tests |\n" + // 5: fine
		"| PostgreSQL | `INSERT` (1) you run PostgreSQL |\n" + // 6: a cell too few
		"| Redis | `a|b` | always |\n" + // 7: a cell too many
		"| Redis | `a\\|b` | always |\n" + // 8: fine
		"\n" + // 9
		"a | b\n" + // 10
		"--- | ---\n" + // 11
		"1 | 2\n" + // 12: fine
		"\n" + // 13
		"```\n" + // 14
		"| x | y |\n" + // 15
		"| --- |\n" + // 16: in a code block
		"```\n"
	m, problems := parseMarkdown("sample.md", sample)
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	got := strings.Join(m.tableProblems(), "\n")
	for _, want := range []string{
		"sample.md:6: the table row has 2 cells, its header (line 3) 3",
		"sample.md:7: the table row has 4 cells, its header (line 3) 3",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the checker did not report %q; it reported:\n%s", want, got)
		}
	}
	if n := len(m.tableProblems()); n != 2 {
		t.Errorf("the checker reported %d problems, want 2:\n%s", n, got)
	}
}
