package docs_test

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// markdown is one Markdown file, split into its fenced code blocks and the
// prose around them.
type markdown struct {
	path   string   // relative to the repository root, with forward slashes
	prose  []string // the file's lines, those of fenced blocks (fences included) blank
	blocks []fence
}

// fence is one fenced code block.
type fence struct {
	line   int    // of the opening fence, 1-based
	info   string // the info string: "go", "sh", ""
	code   string // the lines between the fences, the fence's indentation removed
	marker string // the reason given by a fragment marker right above the block, if any
}

// fragmentMarker, alone on the line right above a ```go block, says that
// the block is deliberately not a program nor a fragment a harness can
// complete (an API summary, say), and why; the block must still parse.
// Keep these rare.
var fragmentMarker = regexp.MustCompile(`^<!--\s*fragment:\s*(.*?)\s*-->$`)

// where names a line of a Markdown file as editors and go vet do.
func (m *markdown) where(line int) string { return m.path + ":" + strconv.Itoa(line) }

// parseMarkdown splits text into prose and fenced code blocks (``` or ~~~,
// indented or not, as in a list item). An unclosed fence is a problem.
func parseMarkdown(path, text string) (*markdown, []string) {
	m := &markdown{path: path}
	var (
		problems []string
		cur      *fence
		fenceCh  byte
		fenceLen int
		indent   int
	)
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	for i, line := range lines {
		trimmed := strings.TrimLeft(line, " ")
		if cur == nil {
			ch, n := fenceRun(trimmed)
			if n >= 3 && !(ch == '`' && strings.Contains(trimmed[n:], "`")) {
				cur = &fence{line: i + 1, info: strings.TrimSpace(trimmed[n:])}
				fenceCh, fenceLen, indent = ch, n, len(line)-len(trimmed)
				for j := i - 1; j >= 0; j-- {
					if prev := strings.TrimSpace(lines[j]); prev != "" {
						if sm := fragmentMarker.FindStringSubmatch(prev); sm != nil {
							cur.marker = sm[1]
							if cur.marker == "" {
								problems = append(problems, m.where(j+1)+": a fragment marker says why the block is not compiled: <!-- fragment: REASON -->")
							}
						}
						break
					}
				}
				m.prose = append(m.prose, "")
				continue
			}
			m.prose = append(m.prose, line)
			continue
		}
		m.prose = append(m.prose, "")
		if ch, n := fenceRun(trimmed); ch == fenceCh && n >= fenceLen && strings.TrimSpace(trimmed[n:]) == "" {
			m.blocks = append(m.blocks, *cur)
			cur = nil
			continue
		}
		cut := 0
		for cut < indent && cut < len(line) && line[cut] == ' ' {
			cut++
		}
		cur.code += line[cut:] + "\n"
	}
	if cur != nil {
		problems = append(problems, m.where(cur.line)+": the code block is not closed")
	}
	return m, problems
}

// fenceRun returns the fence character at the start of s and how many
// times it repeats (0 when s starts with no fence character).
func fenceRun(s string) (byte, int) {
	if s == "" || (s[0] != '`' && s[0] != '~') {
		return 0, 0
	}
	n := 0
	for n < len(s) && s[n] == s[0] {
		n++
	}
	return s[0], n
}

// goBlocks returns the file's ```go blocks.
func (m *markdown) goBlocks() []fence {
	var out []fence
	for _, b := range m.blocks {
		if lang, _, _ := strings.Cut(b.info, " "); lang == "go" {
			out = append(out, b)
		}
	}
	return out
}

// codeSpan is one inline `code` span of the prose.
type codeSpan struct {
	line int // where it starts, 1-based
	text string
}

// scanCodeSpans returns the prose without its inline code spans (each
// replaced by spaces, newlines kept, so offsets and lines stay put) and
// the spans. A run of n backticks opens a span closed by the next run of
// exactly n backticks (CommonMark); an unmatched run is literal text.
func (m *markdown) scanCodeSpans() (string, []codeSpan) {
	text := []byte(strings.Join(m.prose, "\n"))
	var spans []codeSpan
	line := 1
	for i := 0; i < len(text); {
		if text[i] == '\n' {
			line++
		}
		if text[i] != '`' {
			i++
			continue
		}
		n := 0
		for i+n < len(text) && text[i+n] == '`' {
			n++
		}
		end := -1
		for j := i + n; j < len(text); {
			if text[j] != '`' {
				j++
				continue
			}
			k := 0
			for j+k < len(text) && text[j+k] == '`' {
				k++
			}
			if k == n {
				end = j
				break
			}
			j += k
		}
		if end < 0 {
			i += n
			continue
		}
		inner := string(text[i+n : end])
		spans = append(spans, codeSpan{line: line, text: strings.TrimSpace(strings.ReplaceAll(inner, "\n", " "))})
		for j := i; j < end+n; j++ {
			if text[j] == '\n' {
				line++
			} else {
				text[j] = ' '
			}
		}
		i = end + n
	}
	return string(text), spans
}

var (
	atxHeading  = regexp.MustCompile(`^ {0,3}#{1,6}(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$`)
	htmlAnchor  = regexp.MustCompile(`<a\s+(?:name|id)\s*=\s*"([^"]+)"`)
	inlineLink  = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	htmlTag     = regexp.MustCompile(`<[^>]+>`)
	refLinkDef  = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:[ \t]*<?([^\s>]+)>?`)
	htmlLinkAtt = regexp.MustCompile(`(?:href|src)\s*=\s*"([^"]*)"`)
)

// anchors returns the anchors GitHub gives the file's headings (and any
// <a name> or <a id> of its own).
func (m *markdown) anchors() map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, line := range m.prose {
		for _, sm := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			out[sm[1]] = true
		}
		sm := atxHeading.FindStringSubmatch(line)
		if sm == nil {
			continue
		}
		a := githubAnchor(sm[1])
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// githubAnchor is the anchor GitHub gives a heading: its text as rendered
// (code spans' content, links' text, no emphasis stars or HTML tags),
// lowercased, every character but letters, marks, digits, '_', '-' and
// spaces removed, and spaces turned into '-'. A heading whose anchor an
// earlier heading of the file already has gets "-1", "-2", ... appended.
func githubAnchor(heading string) string {
	s := inlineLink.ReplaceAllString(heading, "$1")
	s = htmlTag.ReplaceAllString(s, "")
	s = strings.NewReplacer("`", "", "*", "").Replace(s)
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case unicode.IsLetter(r), unicode.IsMark(r), unicode.Is(unicode.Nd, r), unicode.Is(unicode.Pc, r), r == '-':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// link is one link destination of the prose.
type link struct {
	line   int
	target string
}

// links returns the destinations of the prose's inline links and images
// ([text](dest), ![alt](dest)), reference definitions ([label]: dest) and
// HTML href and src attributes, outside code blocks and code spans.
func (m *markdown) links() []link {
	prose, _ := m.scanCodeSpans()
	var out []link
	lineAt := func(off int) int { return 1 + strings.Count(prose[:off], "\n") }
	for i := 0; ; {
		j := strings.Index(prose[i:], "](")
		if j < 0 {
			break
		}
		start := i + j + 2
		i = start
		dest, ok := linkDestination(prose[start:])
		if !ok {
			continue
		}
		out = append(out, link{line: lineAt(start), target: dest})
	}
	for n, line := range strings.Split(prose, "\n") {
		if sm := refLinkDef.FindStringSubmatch(line); sm != nil {
			out = append(out, link{line: n + 1, target: sm[1]})
		}
		for _, sm := range htmlLinkAtt.FindAllStringSubmatch(line, -1) {
			out = append(out, link{line: n + 1, target: sm[1]})
		}
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].line < out[b].line })
	return out
}

// linkDestination reads the destination at the start of s (what follows
// "]("): <dest> or a run without spaces, parentheses balanced, followed by
// an optional title and the closing parenthesis.
func linkDestination(s string) (string, bool) {
	s = strings.TrimLeft(s, " \t\n")
	if strings.HasPrefix(s, "<") {
		end := strings.IndexAny(s, ">\n")
		if end < 0 || s[end] != '>' {
			return "", false
		}
		return s[1:end], true
	}
	depth := 0
	for i, r := range s {
		switch {
		case r == '(':
			depth++
		case r == ')' && depth > 0:
			depth--
		case r == ')' || r == ' ' || r == '\t' || r == '\n':
			if i == 0 {
				return "", false
			}
			return s[:i], true
		}
	}
	return "", false
}

// repository is the set of files a link may point at and the Markdown
// files to check.
type repository struct {
	root  string
	files map[string]bool // relative, slash-separated
	dirs  map[string]bool // every folder holding one of files ("" is the root)
}

// loadRepository lists the files git tracks (and untracked ones it does
// not ignore, so a file about to be added counts) that exist on disk.
// Outside a git checkout it walks the tree, leaving out .git, testdata and
// node_modules.
func loadRepository(t *testing.T, root string) repository {
	t.Helper()
	r := repository{root: root, files: map[string]bool{}, dirs: map[string]bool{"": true}}
	var names []string
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	if out, err := cmd.Output(); err == nil {
		for _, name := range bytes.Split(out, []byte{0}) {
			if len(name) > 0 {
				names = append(names, string(name))
			}
		}
	} else {
		t.Logf("git ls-files: %v; walking the tree instead", err)
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && p != root || d.Name() == "testdata" || d.Name() == "node_modules") {
				return filepath.SkipDir
			}
			if !d.IsDir() {
				rel, _ := filepath.Rel(root, p)
				names = append(names, filepath.ToSlash(rel))
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range names {
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(name))); err != nil {
			continue // deleted, not yet staged
		}
		r.files[name] = true
		for d := path.Dir(name); d != "."; d = path.Dir(d) {
			r.dirs[d] = true
		}
	}
	return r
}

// markdownFiles parses every Markdown file of the repository, sorted by path.
func (r repository) markdownFiles(t *testing.T) []*markdown {
	t.Helper()
	var names []string
	for name := range r.files {
		if strings.HasSuffix(name, ".md") {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	var out []*markdown
	for _, name := range names {
		b, err := os.ReadFile(filepath.Join(r.root, filepath.FromSlash(name)))
		if err != nil {
			t.Fatal(err)
		}
		m, problems := parseMarkdown(name, string(b))
		for _, p := range problems {
			t.Error(p)
		}
		out = append(out, m)
	}
	if len(out) == 0 {
		t.Fatal("no Markdown file found")
	}
	return out
}
