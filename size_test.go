package metasync_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// The size caps of the Go code: a function longer than maxFuncLines,
// counted from its func line to its closing brace, is cut into steps; a
// file longer than maxFileLines is split by topic. Tests count too.
const (
	maxFuncLines = 120
	maxFileLines = 700
)

// uncapped are the top folders the caps leave alone: programs for people
// (hack, examples) and the control-plane tests under test/.
var uncapped = []string{"hack", "examples", "test"}

// TestSizeCaps: no Go file outside uncapped is over maxFileLines lines and
// no function declared in one over maxFuncLines; each offender is named
// with its length, to say what to split.
func TestSizeCaps(t *testing.T) {
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "bin") {
				return filepath.SkipDir
			}
			for _, top := range uncapped {
				if filepath.ToSlash(path) == top {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		file, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		slash := filepath.ToSlash(path)
		if n := fset.File(file.Pos()).LineCount(); n > maxFileLines {
			t.Errorf("%s is %d lines, over %d: split it in two by topic", slash, n, maxFileLines)
		}
		for _, decl := range file.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			n := fset.Position(fn.Body.Rbrace).Line - fset.Position(fn.Pos()).Line + 1
			if n > maxFuncLines {
				t.Errorf("%s: %s is %d lines, over %d: cut it into steps", slash, funcName(fn), n, maxFuncLines)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// funcName is a function's name as a reader looks for it: Type.Method for
// a method.
func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	typ := fn.Recv.List[0].Type
	for {
		switch x := typ.(type) {
		case *ast.StarExpr:
			typ = x.X
			continue
		case *ast.IndexExpr:
			typ = x.X
			continue
		case *ast.IndexListExpr:
			typ = x.X
			continue
		case *ast.ParenExpr:
			typ = x.X
			continue
		case *ast.Ident:
			return x.Name + "." + fn.Name.Name
		}
		return fn.Name.Name
	}
}
