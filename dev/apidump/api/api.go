// Package api lists the exported API of a Go module from its source, for
// cmd apidump and its test.
package api

import (
	"bytes"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// LibraryModules are the directories (relative to the repository root) of
// the modules users depend on: the only list of them. Each keeps its
// api.txt, and dev/release releases them together.
var LibraryModules = []string{".", "stores/redis", "stores/dynamo", "stores/postgres", "lambdadedup", "oteldedup", "metrics", "cmd/dedupctl"}

// rootModule is the first line of the repository root's go.mod.
const rootModule = "module github.com/watermill-dedup/watermill-dedup\n"

// RepoRoot returns the repository root: the directory, at or above the
// working directory, whose go.mod declares the root module.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.HasPrefix(b, []byte(rootModule)) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod of module github.com/watermill-dedup/watermill-dedup above the working directory")
		}
		dir = parent
	}
}

// Module returns the sorted API lines of the module in dir and the number
// of exported names of each of its packages (top-level names plus the
// methods of exported concrete types).
func Module(dir string) (lines []string, counts map[string]int, err error) {
	modPath, err := modulePath(dir)
	if err != nil {
		return nil, nil, err
	}
	counts = map[string]int{}
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if path != dir {
			if name == "internal" || name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "node_modules" {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // a module of its own
			}
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		importPath := modPath
		if rel != "." {
			importPath += "/" + filepath.ToSlash(rel)
		}
		pkgLines, n, err := packageAPI(path, importPath)
		if err != nil {
			return err
		}
		if pkgLines != nil {
			lines = append(lines, pkgLines...)
			counts[importPath] = n
		}
		return nil
	})
	sort.Strings(lines)
	return lines, counts, err
}

func modulePath(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return "", err
	}
	first, _, _ := strings.Cut(string(b), "\n")
	p, ok := strings.CutPrefix(first, "module ")
	if !ok {
		return "", fmt.Errorf("%s/go.mod: no module line first", dir)
	}
	return strings.TrimSpace(p), nil
}

// packageAPI returns the lines of the package in dir (nil when dir has no
// non-test Go file, or only a main package).
func packageAPI(dir, importPath string) ([]string, int, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, 0, err
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, 0, err
		}
		if f.Name.Name == "main" {
			return nil, 0, nil
		}
		files = append(files, f)
	}
	if len(files) == 0 {
		return nil, 0, nil
	}
	p := &lister{fset: fset, prefix: "pkg " + importPath + ", "}
	for _, f := range files {
		for _, decl := range f.Decls {
			p.decl(decl)
		}
	}
	return p.lines, p.count, nil
}

type lister struct {
	fset   *token.FileSet
	prefix string
	lines  []string
	count  int
}

func (p *lister) add(format string, args ...any) {
	p.lines = append(p.lines, p.prefix+fmt.Sprintf(format, args...))
}

func (p *lister) src(n ast.Node) string {
	var b bytes.Buffer
	_ = printer.Fprint(&b, p.fset, n)
	return strings.Join(strings.Fields(b.String()), " ")
}

func (p *lister) decl(decl ast.Decl) {
	switch d := decl.(type) {
	case *ast.FuncDecl:
		if !d.Name.IsExported() {
			return
		}
		if d.Recv == nil {
			p.count++
			p.add("func %s%s%s", d.Name.Name, p.typeParams(d.Type.TypeParams), p.signature(d.Type))
			return
		}
		recv := d.Recv.List[0].Type
		base := recv
		if star, ok := base.(*ast.StarExpr); ok {
			base = star.X
		}
		if idx, ok := base.(*ast.IndexExpr); ok {
			base = idx.X
		}
		if idx, ok := base.(*ast.IndexListExpr); ok {
			base = idx.X
		}
		if id, ok := base.(*ast.Ident); !ok || !id.IsExported() {
			return
		}
		p.count++
		p.add("method (%s) %s%s", p.src(recv), d.Name.Name, p.signature(d.Type))
	case *ast.GenDecl:
		var lastType ast.Expr
		for _, spec := range d.Specs {
			switch s := spec.(type) {
			case *ast.TypeSpec:
				p.typeSpec(s)
			case *ast.ValueSpec:
				if s.Type != nil || len(s.Values) > 0 {
					lastType = s.Type
				}
				for i, name := range s.Names {
					if !name.IsExported() {
						continue
					}
					p.count++
					kind := "var"
					if d.Tok == token.CONST {
						kind = "const"
					}
					switch {
					case lastType != nil:
						p.add("%s %s %s", kind, name.Name, p.src(lastType))
					case i < len(s.Values) && kind == "var":
						p.add("%s %s %s", kind, name.Name, p.valueType(s.Values[i]))
					case i < len(s.Values):
						p.add("%s %s = %s", kind, name.Name, p.src(s.Values[i]))
					default:
						p.add("%s %s", kind, name.Name)
					}
				}
			}
		}
	}
}

// valueType names the type of a var's value where the source shows it.
func (p *lister) valueType(v ast.Expr) string {
	switch e := v.(type) {
	case *ast.CallExpr:
		if sel, ok := e.Fun.(*ast.SelectorExpr); ok {
			if x, ok := sel.X.(*ast.Ident); ok && (x.Name == "errors" && sel.Sel.Name == "New" || x.Name == "fmt" && sel.Sel.Name == "Errorf") {
				return "error"
			}
		}
	case *ast.CompositeLit:
		return p.src(e.Type)
	case *ast.UnaryExpr:
		if lit, ok := e.X.(*ast.CompositeLit); ok && e.Op == token.AND {
			return "*" + p.src(lit.Type)
		}
	}
	return "= " + p.src(v)
}

func (p *lister) typeSpec(s *ast.TypeSpec) {
	if !s.Name.IsExported() {
		return
	}
	p.count++
	name := s.Name.Name + p.typeParams(s.TypeParams)
	if s.Assign.IsValid() {
		p.add("type %s = %s", name, p.src(s.Type))
		return
	}
	switch t := s.Type.(type) {
	case *ast.StructType:
		p.add("type %s struct", name)
		for _, f := range t.Fields.List {
			if len(f.Names) == 0 {
				embedded := f.Type
				if star, ok := embedded.(*ast.StarExpr); ok {
					embedded = star.X
				}
				if sel, ok := embedded.(*ast.SelectorExpr); ok {
					embedded = sel.Sel
				}
				if id, ok := embedded.(*ast.Ident); ok && id.IsExported() {
					p.add("type %s struct, embedded %s", name, p.src(f.Type))
				}
				continue
			}
			for _, n := range f.Names {
				if n.IsExported() {
					p.add("type %s struct, %s %s", name, n.Name, p.src(f.Type))
				}
			}
		}
	case *ast.InterfaceType:
		p.add("type %s interface", name)
		for _, m := range t.Methods.List {
			if len(m.Names) == 0 {
				p.add("type %s interface, embedded %s", name, p.src(m.Type))
				continue
			}
			for _, n := range m.Names {
				if !n.IsExported() {
					p.add("type %s interface, unexported methods", name)
					continue
				}
				if ft, ok := m.Type.(*ast.FuncType); ok {
					p.add("type %s interface, %s%s", name, n.Name, p.signature(ft))
				}
			}
		}
	default:
		p.add("type %s %s", name, p.src(s.Type))
	}
}

func (p *lister) typeParams(l *ast.FieldList) string {
	if l == nil || len(l.List) == 0 {
		return ""
	}
	var parts []string
	for _, f := range l.List {
		names := make([]string, len(f.Names))
		for i, n := range f.Names {
			names[i] = n.Name
		}
		parts = append(parts, strings.Join(names, ", ")+" "+p.src(f.Type))
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// signature prints the parameter and result types without names.
func (p *lister) signature(t *ast.FuncType) string {
	s := "(" + p.fields(t.Params) + ")"
	if t.Results == nil || len(t.Results.List) == 0 {
		return s
	}
	results := p.fields(t.Results)
	if len(t.Results.List) == 1 && len(t.Results.List[0].Names) <= 1 {
		return s + " " + results
	}
	return s + " (" + results + ")"
}

func (p *lister) fields(l *ast.FieldList) string {
	if l == nil {
		return ""
	}
	var types []string
	for _, f := range l.List {
		n := max(len(f.Names), 1)
		for range n {
			types = append(types, p.src(f.Type))
		}
	}
	return strings.Join(types, ", ")
}

// Diff returns the lines only in a (prefixed "-") and only in b ("+").
func Diff(a, b string) string {
	inA, inB := set(a), set(b)
	var out []string
	for l := range inA {
		if !inB[l] {
			out = append(out, "-"+l)
		}
	}
	for l := range inB {
		if !inA[l] {
			out = append(out, "+"+l)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i][1:] < out[j][1:] })
	return strings.Join(out, "\n") + "\n"
}

func set(s string) map[string]bool {
	m := map[string]bool{}
	for _, l := range strings.Split(s, "\n") {
		if l != "" {
			m[l] = true
		}
	}
	return m
}
