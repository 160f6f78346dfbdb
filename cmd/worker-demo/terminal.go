package main

import (
	"io"
	"os"
	"strconv"
	"strings"
	"unicode/utf8"
)

// defaultWidth is the width assumed when neither COLUMNS nor the terminal
// says one.
const defaultWidth = 80

// terminal is what the demo may do on its output.
type terminal struct {
	// tty: the output is a terminal, maybe a dumb one, whose lines must
	// fit its width.
	tty bool
	// live: redraw the view in place, moving the cursor up over the last
	// frame. Only on a terminal that is not TERM=dumb, and without --plain.
	live bool
	// color: colour escapes. Only when live and NO_COLOR is unset or empty
	// (the convention of no-color.org).
	color bool
	// width returns the columns a line may take, read again each frame so
	// that a resized terminal is followed.
	width func() int
}

// detectTerminal looks at out and the environment. A non-terminal output
// (a pipe, a file, a test's buffer) gets plain progress lines, as does
// TERM=dumb and --plain.
func detectTerminal(out io.Writer, plain bool, getenv func(string) string) terminal {
	f, _ := out.(*os.File)
	return newTerminal(f != nil && isTerminal(f), plain, getenv, func() int { return terminalWidth(f) })
}

// newTerminal decides from its inputs: isTTY says whether the output is a
// terminal, size returns its width in columns (0 when unknown).
func newTerminal(isTTY, plain bool, getenv func(string) string, size func() int) terminal {
	live := isTTY && !plain && getenv("TERM") != "dumb"
	return terminal{
		tty:   isTTY,
		live:  live,
		color: live && getenv("NO_COLOR") == "",
		width: func() int { return columns(getenv("COLUMNS"), size) },
	}
}

// columns is the width to draw at: COLUMNS when it is a positive number
// (the user's say), else the terminal's, else defaultWidth.
func columns(env string, size func() int) int {
	if n, err := strconv.Atoi(strings.TrimSpace(env)); err == nil && n > 0 {
		return n
	}
	if size != nil {
		if n := size(); n > 0 {
			return n
		}
	}
	return defaultWidth
}

// isTerminal reports whether f is a character device, as a terminal is.
func isTerminal(f *os.File) bool {
	info, err := f.Stat()
	return err == nil && info.Mode()&os.ModeCharDevice != 0
}

// ANSI sequences the view uses.
const (
	escape    = "\x1b["
	clearLine = escape + "K"
	green     = escape + "32m"
	red       = escape + "31m"
	bold      = escape + "1m"
	reset     = escape + "0m"
)

// cursorUp moves the cursor up n lines.
func cursorUp(n int) string { return escape + strconv.Itoa(n) + "A" }

// paint wraps s in a colour when on is set.
func paint(on bool, color, s string) string {
	if !on || s == "" {
		return s
	}
	return color + s + reset
}

// visibleWidth counts the runes of s that take a column: every rune but
// those of escape sequences. The view's glyphs each take one.
func visibleWidth(s string) int {
	n := 0
	for i := 0; i < len(s); {
		if end := escapeEnd(s, i); end > i {
			i = end
			continue
		}
		_, size := utf8.DecodeRuneInString(s[i:])
		i += size
		n++
	}
	return n
}

// fit cuts s to at most width visible runes, ending it with "…" when cut
// and keeping every escape sequence, so that a colour is still reset.
func fit(s string, width int) string {
	if visibleWidth(s) <= width {
		return s
	}
	var b strings.Builder
	n := 0
	for i := 0; i < len(s); {
		if end := escapeEnd(s, i); end > i {
			b.WriteString(s[i:end])
			i = end
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		i += size
		switch {
		case n < width-1:
			b.WriteRune(r)
		case n == width-1 && width > 0:
			b.WriteRune('…')
		}
		n++
	}
	return b.String()
}

// escapeEnd returns the end of the CSI sequence starting at s[i], or i when
// none starts there.
func escapeEnd(s string, i int) int {
	if !strings.HasPrefix(s[i:], escape) {
		return i
	}
	for j := i + len(escape); j < len(s); j++ {
		if s[j] >= 0x40 && s[j] <= 0x7e {
			return j + 1
		}
	}
	return len(s)
}

// wrap breaks s at spaces into lines of at most width runes, every line
// after the first starting with indent. The spaces inside a line are kept,
// those at a break dropped; a word longer than a line stays whole.
func wrap(s string, width int, indent string) []string {
	var lines []string
	for utf8.RuneCountInString(s) > width {
		lead := len(s) - len(strings.TrimLeft(s, " "))
		cut, n := -1, 0 // cut: the last space with at most width runes before it
		for i, r := range s {
			if n > width {
				break
			}
			if r == ' ' && i > lead {
				cut = i
			}
			n++
		}
		if cut < 0 { // the first word fills the line: break after it
			next := strings.IndexByte(s[lead:], ' ')
			if next < 0 {
				break
			}
			cut = lead + next
		}
		lines = append(lines, strings.TrimRight(s[:cut], " "))
		rest := strings.TrimLeft(s[cut:], " ")
		if rest == "" {
			return lines
		}
		s = indent + rest
	}
	return append(lines, s)
}
