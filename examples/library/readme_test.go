package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// docs/library.md ("Use it as a library") holds main.go between these
// lines, in a ```go block.
const (
	readmeBegin = "<!-- begin examples/library/main.go: examples/library/readme_test.go keeps this block equal to the file -->\n```go\n"
	readmeEnd   = "```\n<!-- end examples/library/main.go -->\n"
)

// TestREADMEIsTheProgram checks that the program shown in docs/library.md
// is main.go, character for character, so that the page's code is the code
// that go vet and these tests compile and run.
func TestREADMEIsTheProgram(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "docs", "library.md"))
	if err != nil {
		t.Fatal(err)
	}
	program, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	text := string(readme)
	if n := strings.Count(text, readmeBegin); n != 1 {
		t.Fatalf("docs/library.md has %d begin markers, want 1:\n%s", n, readmeBegin)
	}
	_, rest, _ := strings.Cut(text, readmeBegin)
	block, _, found := strings.Cut(rest, readmeEnd)
	if !found {
		t.Fatalf("docs/library.md has no end marker after the begin marker:\n%s", readmeEnd)
	}
	if block != string(program) {
		got, want := strings.Split(block, "\n"), strings.Split(string(program), "\n")
		for i := range max(len(got), len(want)) {
			var g, w string
			if i < len(got) {
				g = got[i]
			}
			if i < len(want) {
				w = want[i]
			}
			if g != w {
				t.Fatalf("docs/library.md's program differs from main.go at line %d of the block:\npage:    %q\nmain.go: %q\ncopy main.go into docs/library.md between the markers", i+1, g, w)
			}
		}
	}
}
