package jobthrottle_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestREADMEShowsTheFirstWorker: the README's first worker is the body of
// Example in example_test.go, which the compiler checks.
func TestREADMEShowsTheFirstWorker(t *testing.T) {
	example := readFile(t, "example_test.go")
	start := strings.Index(example, "\nfunc Example() {\n")
	if start < 0 {
		t.Fatal("example_test.go has no func Example")
	}
	body := example[start+len("\nfunc Example() {\n"):]
	body = body[:strings.Index(body, "\n}\n")+1]
	var lines []string
	for _, line := range strings.SplitAfter(body, "\n") {
		lines = append(lines, strings.TrimPrefix(line, "\t"))
	}
	want := strings.Join(lines, "")

	readme := readFile(t, "README.md")
	const marker = "<!-- The code below is the body of Example in example_test.go"
	at := strings.Index(readme, marker)
	if at < 0 {
		t.Fatal("README.md lost the marker before its first worker")
	}
	block := readme[at:]
	block = block[strings.Index(block, "```go\n")+len("```go\n"):]
	block = block[:strings.Index(block, "```")]
	if block != want {
		t.Errorf("README.md's first worker differs from Example in example_test.go:\nREADME:\n%s\nExample:\n%s", block, want)
	}
}

// TestDocsLinksResolve: every relative link in README.md and docs/ names a
// file or directory of the repository, and an anchor into a Markdown file
// names one of its headings.
func TestDocsLinksResolve(t *testing.T) {
	pages, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, "README.md")
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	checked := 0
	for _, page := range pages {
		for _, m := range link.FindAllStringSubmatch(withoutCode(readFile(t, page)), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			checked++
			path, anchor, _ := strings.Cut(target, "#")
			if path == "" {
				path = page
			} else {
				path = filepath.Join(filepath.Dir(page), path)
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s: link %q: %v", page, target, err)
				continue
			}
			if anchor != "" && strings.HasSuffix(path, ".md") && !headingAnchors(t, path)[anchor] {
				t.Errorf("%s: link %q: %s has no heading #%s", page, target, path, anchor)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative links found: the check checks nothing")
	}
}

// withoutCode drops fenced code blocks, whose brackets are not links.
func withoutCode(s string) string {
	var b strings.Builder
	inCode := false
	for _, line := range strings.SplitAfter(s, "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
			continue
		}
		if !inCode {
			b.WriteString(line)
		}
	}
	return b.String()
}

// headingAnchors returns the anchors a Markdown renderer gives path's
// headings: lower case, spaces as hyphens, punctuation dropped.
func headingAnchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	anchors := map[string]bool{}
	for _, line := range strings.Split(withoutCode(readFile(t, path)), "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		var b strings.Builder
		for _, r := range title {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
				b.WriteRune(r)
			}
		}
		anchors[b.String()] = true
	}
	return anchors
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
