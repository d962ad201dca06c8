// Package metasync_test checks the habits of the whole tree.
package metasync_test

import (
	"errors"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// parsePackage parses the Go files of the package in dir, its tests left
// out, as the go command selects them for this platform; nil files when
// dir holds none.
func parsePackage(fset *token.FileSet, dir string, mode parser.Mode) (name string, files map[string]*ast.File, err error) {
	pkg, err := build.ImportDir(dir, 0)
	if err != nil {
		var none *build.NoGoError
		if errors.As(err, &none) {
			return "", nil, nil
		}
		return "", nil, err
	}
	files = map[string]*ast.File{}
	for _, f := range pkg.GoFiles {
		path := filepath.Join(dir, f)
		if files[path], err = parser.ParseFile(fset, path, nil, mode); err != nil {
			return "", nil, err
		}
	}
	return pkg.Name, files, nil
}

// TestPackageDocs checks that every package has a package comment and
// every exported top-level name a doc comment.
func TestPackageDocs(t *testing.T) {
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "bin" {
			return filepath.SkipDir
		}
		fset := token.NewFileSet()
		name, files, err := parsePackage(fset, path, parser.ParseComments)
		if err != nil || files == nil {
			return err
		}
		{
			documented := false
			for _, f := range files {
				if f.Doc != nil {
					documented = true
				}
				for _, decl := range f.Decls {
					checkDecl(t, fset, decl)
				}
			}
			if !documented {
				t.Errorf("package %s in %s has no package comment", name, path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func checkDecl(t *testing.T, fset *token.FileSet, decl ast.Decl) {
	t.Helper()
	switch d := decl.(type) {
	case *ast.FuncDecl:
		if d.Name.IsExported() && d.Doc == nil && (d.Recv == nil || exportedRecv(d.Recv)) && !isInterfaceMethodImpl(d) {
			t.Errorf("%s: exported %s has no doc comment", fset.Position(d.Pos()), d.Name.Name)
		}
	case *ast.GenDecl:
		for _, spec := range d.Specs {
			if ts, ok := spec.(*ast.TypeSpec); ok && ts.Name.IsExported() && d.Doc == nil && ts.Doc == nil {
				t.Errorf("%s: exported type %s has no doc comment", fset.Position(ts.Pos()), ts.Name.Name)
			}
		}
	}
}

func exportedRecv(fl *ast.FieldList) bool {
	typ := fl.List[0].Type
	if star, ok := typ.(*ast.StarExpr); ok {
		typ = star.X
	}
	if idx, ok := typ.(*ast.IndexExpr); ok {
		typ = idx.X
	}
	id, ok := typ.(*ast.Ident)
	return ok && id.IsExported()
}

// isInterfaceMethodImpl exempts the methods that implement well-known
// interfaces (error, Stringer, runtime.Object...), documented there.
func isInterfaceMethodImpl(d *ast.FuncDecl) bool {
	switch d.Name.Name {
	case "Error", "String", "GetObjectKind", "DeepCopyObject", "Unwrap":
		return true
	}
	return false
}
