package metasync_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	mdLink    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	mdHeading = regexp.MustCompile("(?m)^#+ (.+)$")
	mdFence   = regexp.MustCompile("(?ms)^```.*?^```")
)

// anchorOf is the anchor that GitHub gives a heading.
func anchorOf(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestDocLinks: every relative link of the README and the pages of docs/
// names a file that exists, and every anchor a heading of its page.
func TestDocLinks(t *testing.T) {
	pages, _ := filepath.Glob("docs/*.md")
	pages = append(pages, "README.md", "DEVELOPERS.md", "BENCHMARKS.md", "RELIABILITY.md", "CHANGELOG.md")
	anchors := func(path string) map[string]bool {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		out := map[string]bool{}
		for _, m := range mdHeading.FindAllStringSubmatch(mdFence.ReplaceAllString(string(b), ""), -1) {
			out[anchorOf(m[1])] = true
		}
		return out
	}
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Errorf("%s: %v", page, err)
			continue
		}
		text := mdFence.ReplaceAllString(string(b), "")
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			link := m[1]
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(link, "#")
			target := page
			if file != "" {
				target = filepath.Join(filepath.Dir(page), file)
				if _, err := os.Stat(target); err != nil {
					t.Errorf("%s: link %s: no such file", page, link)
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(target, ".md") && !anchors(target)[anchor] {
				t.Errorf("%s: link %s: %s has no heading #%s", page, link, target, anchor)
			}
		}
	}
}

// maxBenchmarksLines bounds BENCHMARKS.md: a reference of the current
// figures that a user reads, not a diary of every run.
const maxBenchmarksLines = 800

// TestBenchmarksLength: BENCHMARKS.md holds the current figures in at
// most maxBenchmarksLines lines, and points to the record of past runs,
// docs/benchmarks-history.md, where earlier figures go when newer ones
// replace them.
func TestBenchmarksLength(t *testing.T) {
	b, err := os.ReadFile("BENCHMARKS.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	lines := strings.Count(text, "\n")
	if !strings.HasSuffix(text, "\n") {
		lines++
	}
	if lines > maxBenchmarksLines {
		t.Errorf("BENCHMARKS.md has %d lines, more than %d: keep the newest figure of each measure and move the older runs to docs/benchmarks-history.md", lines, maxBenchmarksLines)
	}
	if !strings.Contains(text, "(docs/benchmarks-history.md") {
		t.Error("BENCHMARKS.md does not link to docs/benchmarks-history.md, the record of past runs")
	}
	if _, err := os.Stat("docs/benchmarks-history.md"); err != nil {
		t.Error(err)
	}
}

// TestDocYAMLBlocks: every yaml block of docs/ is a part of a file of
// the tree (the reference config examples/appmodel/config.yaml, the
// manifests of deploy/ or examples/): its lines, without their
// indentation and comments, are lines of one such file, in the file's order. So a rule
// or a manifest the pages show is one that the reference setup runs and
// its tests check.
func TestDocYAMLBlocks(t *testing.T) {
	var files [][]string
	for _, dir := range []string{"examples", "deploy"} {
		_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() && strings.HasSuffix(path, ".yaml") {
				b, _ := os.ReadFile(path)
				files = append(files, strings.Split(string(b), "\n"))
			}
			return nil
		})
	}
	// bare is a line without its indentation and its comment.
	bare := func(line string) string {
		if i := strings.Index(line, " #"); i >= 0 {
			line = line[:i]
		}
		return strings.TrimSpace(line)
	}
	// partOf reports whether block's lines are lines of file, in order.
	partOf := func(block, file []string) bool {
		at := 0
		for _, line := range block {
			for at < len(file) && bare(file[at]) != bare(line) {
				at++
			}
			if at == len(file) {
				return false
			}
			at++
		}
		return true
	}
	pages, _ := filepath.Glob("docs/*.md")
	blocks := 0
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		rest := string(b)
		for {
			var block string
			var ok bool
			if _, rest, ok = strings.Cut(rest, "```yaml\n"); !ok {
				break
			}
			block, rest, _ = strings.Cut(rest, "```")
			blocks++
			lines := strings.Split(strings.TrimRight(block, "\n "), "\n")
			found := false
			for _, f := range files {
				if partOf(lines, f) {
					found = true
					break
				}
			}
			if !found {
				t.Errorf("%s: a yaml block that is no part of a file of examples/ or deploy/:\n%s", page, block)
			}
		}
	}
	if blocks == 0 {
		t.Error("no yaml block in docs/: the test reads none")
	}
}
