package main

import (
	"regexp"
	"strings"
)

// assemble returns the text Redis runs for a script whose own file is
// body: the opening of common (its constants), the helpers of common that
// body uses, directly or through another helper, in common's order, then
// body. A helper counts as used wherever its name appears outside a comment,
// called or not. Leaving the unused ones out matters: Redis runs the whole
// text on every call, and each helper defined is a closure made each time.
func assemble(common, body string) string {
	opening, helpers := splitCommon(common)
	need := make([]bool, len(helpers))
	var visit func(text string)
	visit = func(text string) {
		code := stripComments(text)
		for i, h := range helpers {
			if !need[i] && h.use.MatchString(code) {
				need[i] = true
				visit(h.code)
			}
		}
	}
	visit(body)
	var b strings.Builder
	b.WriteString(opening)
	for i, h := range helpers {
		if need[i] {
			b.WriteString(h.text)
		}
	}
	b.WriteString("\n")
	b.WriteString(body)
	return b.String()
}

// helper is one local function of common.lua, with the comment above it.
type helper struct {
	text string         // its comment and definition
	code string         // its definition alone (what it uses)
	use  *regexp.Regexp // its name as a whole word
}

// splitCommon cuts common.lua before each "local function", keeping each
// function's comment lines with it.
func splitCommon(common string) (string, []helper) {
	lines := strings.SplitAfter(common, "\n")
	var starts, defs []int
	for i, line := range lines {
		if strings.HasPrefix(line, "local function ") {
			start := i
			for start > 0 && strings.HasPrefix(lines[start-1], "--") {
				start--
			}
			starts = append(starts, start)
			defs = append(defs, i)
		}
	}
	if len(starts) == 0 {
		return common, nil
	}
	helpers := make([]helper, len(starts))
	for j, start := range starts {
		end := len(lines)
		if j+1 < len(starts) {
			end = starts[j+1]
		}
		def := strings.Join(lines[defs[j]:end], "")
		name := strings.TrimPrefix(lines[defs[j]], "local function ")
		name = name[:strings.IndexByte(name, '(')]
		helpers[j] = helper{
			text: strings.Join(lines[start:end], ""),
			// the body without its first line, which names the helper itself
			code: def[strings.IndexByte(def, '\n')+1:],
			use:  regexp.MustCompile(`\b` + regexp.QuoteMeta(name) + `\b`),
		}
	}
	return strings.Join(lines[:starts[0]], ""), helpers
}

// stripComments drops Lua's line comments ("--" to the end of the line).
// The scripts hold no "--" inside a string.
func stripComments(text string) string {
	lines := strings.Split(text, "\n")
	for i, line := range lines {
		if at := strings.Index(line, "--"); at >= 0 {
			lines[i] = line[:at]
		}
	}
	return strings.Join(lines, "\n")
}
