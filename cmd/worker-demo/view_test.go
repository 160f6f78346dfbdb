package main

import (
	"bytes"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// env returns an environment holding vars ("NAME=value").
func env(vars ...string) func(string) string {
	return func(name string) string {
		for _, v := range vars {
			if n, value, _ := strings.Cut(v, "="); n == name {
				return value
			}
		}
		return ""
	}
}

// testSnapshot is a run's state with counts as wide as the view allows.
func testSnapshot() snapshot {
	return snapshot{
		elapsed:   83 * time.Second,
		redis:     "embedded Redis 127.0.0.1:40123",
		done:      map[string]int{"acme": 600, "globex": 400, "initech": 1000, "exports": 5},
		expected:  map[string]int{"acme": 1200, "globex": 400, "initech": 1000},
		waited:    map[string]int{"acme": 123456, "globex": 12, "initech": 3},
		resched:   map[string]int{"acme": 1234567, "globex": 0, "initech": 1},
		exporting: 2,
		lastCalls: map[string]int{"acme": 11, "globex": 10, "initech": 3, "": 20},
	}
}

// draw renders frames of a view on term and returns the output.
func draw(t *testing.T, term terminal, frames int) string {
	t.Helper()
	opts, err := parseFlags(nil, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	v := newView(&out, opts, term)
	for range frames {
		v.frame(testSnapshot())
	}
	return out.String()
}

var (
	cursorMoves = regexp.MustCompile(`\x1b\[\d*[ABCDHJ]|\x1b\[K`) // up, down, across, home, erase
	colours     = regexp.MustCompile(`\x1b\[[\d;]*m`)
	anyEscape   = regexp.MustCompile(`\x1b\[[\d;]*[@-~]`)
)

func TestViewFitsTheWidth(t *testing.T) {
	for _, tc := range []struct {
		name      string
		env       []string
		tty       int // the terminal's own width; 0: unknown
		wantWidth int
	}{
		{"80 by default", nil, 0, 80},
		{"the terminal's width", nil, 100, 100},
		{"COLUMNS over the terminal's", []string{"COLUMNS=80"}, 132, 80},
		{"narrow", []string{"COLUMNS=50"}, 0, 50},
		{"wide", []string{"COLUMNS=200"}, 0, 200},
		{"bad COLUMNS", []string{"COLUMNS=wide"}, 0, 80},
	} {
		t.Run(tc.name, func(t *testing.T) {
			term := newTerminal(true, false, env(tc.env...), func() int { return tc.tty })
			if got := term.width(); got != tc.wantWidth {
				t.Fatalf("width %d, want %d", got, tc.wantWidth)
			}
			out := draw(t, term, 3)
			widest := 0
			for i, line := range strings.Split(strings.TrimSuffix(anyEscape.ReplaceAllString(out, ""), "\n"), "\n") {
				n := utf8.RuneCountInString(line)
				widest = max(widest, n)
				if n > tc.wantWidth {
					t.Errorf("line %d is %d runes wide, over %d: %q", i, n, tc.wantWidth, line)
				}
			}
			if tc.wantWidth == 80 && widest < 78 {
				t.Errorf("widest line %d runes: the table does not use the 80 columns", widest)
			}
		})
	}
}

// TestViewRedrawsItsOwnLines checks that each live frame moves the cursor
// up exactly the lines the last one drew, and only that.
func TestViewRedrawsItsOwnLines(t *testing.T) {
	term := newTerminal(true, false, env(), func() int { return 80 })
	out := draw(t, term, 3)
	ups := regexp.MustCompile(`\x1b\[(\d+)A`).FindAllStringSubmatchIndex(out, -1)
	if len(ups) != 2 || ups[0][0] == 0 {
		t.Fatalf("3 frames moved the cursor up %d times, want 2 (none before the first):\n%q", len(ups), out)
	}
	frames := []string{out[:ups[0][0]], out[ups[0][1]:ups[1][0]], out[ups[1][1]:]}
	lines := strings.Count(frames[0], "\n")
	if lines < 8 {
		t.Errorf("first frame of %d lines:\n%s", lines, frames[0])
	}
	for i, up := range ups {
		if moved := out[up[2]:up[3]]; moved != fmt.Sprint(lines) {
			t.Errorf("frame %d moved up %s lines over a frame of %d", i+2, moved, lines)
		}
	}
	for i, frame := range frames {
		if n := strings.Count(frame, "\n"); n != lines {
			t.Errorf("frame %d has %d lines, the first %d", i+1, n, lines)
		}
		// Every line is erased before it is drawn, so a shorter line
		// leaves nothing of the last frame's behind.
		for _, line := range strings.Split(strings.TrimSuffix(frame, "\n"), "\n") {
			if !strings.HasPrefix(line, clearLine) {
				t.Errorf("frame %d: line %q is not erased first", i+1, line)
			}
		}
	}
}

func TestNoColor(t *testing.T) {
	coloured := draw(t, newTerminal(true, false, env(), nil), 2)
	if !colours.MatchString(coloured) {
		t.Fatal("no colour in a live view without NO_COLOR: the test below proves nothing")
	}
	for _, value := range []string{"1", "true", "0"} { // any non-empty value
		term := newTerminal(true, false, env("NO_COLOR="+value), nil)
		if term.color || !term.live {
			t.Errorf("NO_COLOR=%s: colour %v, live %v; want no colour, still live", value, term.color, term.live)
		}
		out := draw(t, term, 2)
		if rest := cursorMoves.ReplaceAllString(out, ""); strings.Contains(rest, escape) {
			t.Errorf("NO_COLOR=%s: escapes other than cursor moves: %q", value, rest)
		}
		var written bytes.Buffer
		summary{lines: []string{"ok    fine", "FAIL  not fine"}}.write(&written, term.color)
		if strings.Contains(written.String(), escape) {
			t.Errorf("NO_COLOR=%s: escapes in the summary: %q", value, written.String())
		}
	}
	if term := newTerminal(true, false, env("NO_COLOR="), nil); !term.color {
		t.Error("NO_COLOR set but empty turned colour off")
	}
}

func TestPlainOutput(t *testing.T) {
	for _, tc := range []struct {
		name  string
		tty   bool
		plain bool
		env   []string
	}{
		{"TERM=dumb", true, false, []string{"TERM=dumb"}},
		{"not a terminal", false, false, []string{"TERM=xterm-256color"}},
		{"--plain", true, true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			term := newTerminal(tc.tty, tc.plain, env(tc.env...), nil)
			if term.live || term.color {
				t.Fatalf("live %v, colour %v; want neither", term.live, term.color)
			}
			out := draw(t, term, 3)
			if strings.Contains(out, escape) {
				t.Errorf("escape sequences in plain output: %q", out)
			}
			lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			if len(lines) != 3 || !strings.HasPrefix(lines[0], " 83s  calls 2000/2600") {
				t.Errorf("want 3 progress lines, got:\n%s", out)
			}
			for _, line := range lines { // a terminal's width, or a log's 80
				if n := utf8.RuneCountInString(line); n > 80 {
					t.Errorf("progress line of %d runes: %q", n, line)
				}
			}
		})
	}
}

func TestFit(t *testing.T) {
	for _, tc := range []struct {
		in    string
		width int
		want  string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{"a bit too long", 10, "a bit too…"},
		{"██░░", 3, "██…"},
		{green + "████" + reset + "░░", 3, green + "██…" + reset},
		{"anything", 0, ""},
	} {
		if got := fit(tc.in, tc.width); got != tc.want {
			t.Errorf("fit(%q, %d) = %q, want %q", tc.in, tc.width, got, tc.want)
		}
	}
}

func TestWrap(t *testing.T) {
	for _, tc := range []struct {
		in    string
		width int
		want  []string
	}{
		{"fits", 10, []string{"fits"}},
		{"exactly 10", 10, []string{"exactly 10"}},
		{"one two three", 9, []string{"one two", "  three"}},
		{"ok    aligned  text wraps", 16, []string{"ok    aligned", "  text wraps"}},
		{"      indented words wrap", 16, []string{"      indented", "  words wrap"}},
		{"unbreakable-word here", 8, []string{"unbreakable-word", "  here"}},
		{"× ± é ü", 3, []string{"× ±", "  é", "  ü"}}, // runes, not bytes
	} {
		got := wrap(tc.in, tc.width, "  ")
		if !slices.Equal(got, tc.want) {
			t.Errorf("wrap(%q, %d) = %q, want %q", tc.in, tc.width, got, tc.want)
		}
	}
}

// TestSummaryFits writes the longest lines a summary can hold, a failing
// sliding-window run's (one note, first: wrappedLines cannot tell a note
// from the continuation of the line before it), and checks that each fits
// 80 columns, keeps its mark and its colour, and loses no word.
func TestSummaryFits(t *testing.T) {
	algo, err := lookupAlgorithm("sliding-window")
	if err != nil {
		t.Fatal(err)
	}
	allows, why := algo.allows(1000)
	s := summary{held: true}
	s.note("Most calls at the partner in any %s, a second less the %s a call may take to get there (%s allows %s):", time.Second-arrivalWithin, arrivalWithin, algo.name, why)
	s.check(false, "%-15s %2d admitted; %s %d/s allows %d", "tenant initech", 123456, algo.name, 1000, allows)
	s.check(false, "%-15s %2d calls; %s %d/s allows %d", "tenant globex", 123456, algo.name, 1000, allows)
	s.check(true, "calls reached the partner %s to %s after their admissions; within %s", -999*time.Millisecond, 99999*time.Millisecond, arrivalWithin)
	s.check(true, "fair shares: not checked (%s rules count calls in windows; only gcra and token-bucket share a limit fairly)", algo.name)
	var out bytes.Buffer
	s.write(&out, true)
	checkFits(t, "summary", out.String())
	plain := anyEscape.ReplaceAllString(out.String(), "")
	if !strings.Contains(out.String(), red+"FAIL"+reset+"  tenant initech") || !strings.Contains(out.String(), green+"ok"+reset+"    fair shares") {
		t.Errorf("marks lost or uncoloured:\n%q", out.String())
	}
	for _, line := range s.lines {
		if !slices.Equal(strings.Fields(line), strings.Fields(strings.Join(wrappedLines(plain, line), " "))) {
			t.Errorf("words of %q not all written, in order:\n%s", line, plain)
		}
	}
}

// wrappedLines returns the lines of out that wrap wrote for line: from the
// one that begins as line does, through its indented continuations.
func wrappedLines(out, line string) []string {
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		if l != "" && strings.HasPrefix(line, l[:min(len(l), 20)]) {
			j := i + 1
			for j < len(lines) && strings.HasPrefix(lines[j], summaryIndent) && !strings.HasPrefix(line, lines[j][:min(len(lines[j]), 20)]) {
				j++
			}
			return lines[i:j]
		}
	}
	return nil
}
