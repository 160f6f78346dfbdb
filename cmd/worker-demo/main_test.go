package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// noEnv is an environment with nothing set.
func noEnv(string) string { return "" }

// TestDemoHoldsThePolicy runs the demo as CI and a newcomer would, with a
// short duration, on the Redis the environment names (embedded by default).
func TestDemoHoldsThePolicy(t *testing.T) {
	args := []string{"--duration", "20s", "--tasks", "180", "--batch", "20", "--exports", "4"}
	addr := os.Getenv("REDIS_ADDR")
	if addr != "" {
		args = append(args, "--redis", addr)
	}
	var out, errs bytes.Buffer
	code := run(context.Background(), args, &out, &errs, noEnv)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errs.String())
	}
	for _, want := range []string{
		"ok    every task processed exactly once: 204 of 204 ran, 0 more than once",
		"ok    tenant acme",      // its highest rate, first call and fair share
		"ok    overall         ", // the highest rate admitted in all
		"ok    calls reached the partner ",
		"its fair share",        // measured, not skipped for a short backlog
		"ok    tenant initech ", // its first admission, not behind the others' backlog
		"ok    asynq: 0 failed, 0 archived",
		"\nThe fleet held the policy.\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.Contains(line, "calls reached the partner ") || strings.Contains(line, " ahead ran first") || strings.Contains(line, "its fair share") {
			t.Logf("figures: %s", line)
		}
	}
	// Not a terminal: plain lines, no cursor movement, no colour.
	if strings.Contains(out.String(), escape) {
		t.Error("escape sequences in output that is not a terminal")
	}
	// The prefix and the command that watches it, on the Redis it used.
	id, watch := introduced(t, out.String())
	if addr == "" {
		addr = `127\.0\.0\.1:\d+` // the embedded Redis, on loopback
	} else {
		addr = regexp.QuoteMeta(addr)
	}
	want := regexp.MustCompile(`^go run \./cmd/throttlectl --redis ` + addr + ` --prefix jtdemo:` + id + `: top$`)
	if !want.MatchString(watch) {
		t.Errorf("watch command %q, want it to match %s", watch, want)
	}
	// Every line fits 80 columns: the intro, the progress lines, the
	// summary and the last word on the keys. The throttlectl command is
	// one line to copy whole; it fits for a Redis on loopback, and is let
	// off for a longer address.
	var longCommand []string
	if len(os.Getenv("REDIS_ADDR")) > len("127.0.0.1:65535") {
		longCommand = append(longCommand, "  "+watch)
	}
	checkFits(t, "stdout", out.String(), longCommand...)
	checkFits(t, "stderr", errs.String())
}

// checkFits fails t for each line of out, but the except ones, that takes
// more than defaultWidth columns: runes, escape sequences none, a tab up to
// the next multiple of 8.
func checkFits(t *testing.T, name, out string, except ...string) {
	t.Helper()
	for i, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if slices.Contains(except, line) {
			continue
		}
		columns := 0
		for _, r := range anyEscape.ReplaceAllString(line, "") {
			columns++
			if r == '\t' {
				columns = (columns + 7) / 8 * 8
			}
		}
		if columns > defaultWidth {
			t.Errorf("%s line %d takes %d columns, over %d: %q", name, i+1, columns, defaultWidth, line)
		}
	}
}

var (
	keysLine  = regexp.MustCompile(`(?m)^Keys: prefix jtdemo:([0-9a-f]{8}):, asynq queue demo-([0-9a-f]{8}),\non the (embedded )?Redis \S+\.$`)
	watchLine = regexp.MustCompile(`(?m)^  (go run \./cmd/throttlectl .*)$`)
)

// introduced returns the demo's id and throttlectl command as its output
// printed them before the first frame.
func introduced(t *testing.T, out string) (id, watch string) {
	t.Helper()
	keys := keysLine.FindStringSubmatch(out)
	cmd := watchLine.FindStringSubmatch(out)
	if keys == nil || cmd == nil || keys[1] != keys[2] {
		t.Fatalf("no key prefix and throttlectl command printed:\n%s", out)
	}
	if first := strings.Index(out, "calls "); first >= 0 && strings.Index(out, cmd[0]) > first {
		t.Errorf("the throttlectl command comes after the first frame:\n%s", out)
	}
	return keys[1], cmd[1]
}

func TestDemoRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--algorithm", "nope"},
		{"--duration", "0s"},
		{"--tasks", "-5"},
		{"--tasks", "0", "--batch", "0", "--exports", "0"},
		{"--servers", "0"},
		{"--no-such-flag"},
		{"extra"},
	} {
		var out, errs bytes.Buffer
		if code := run(context.Background(), args, &out, &errs, noEnv); code != 2 || errs.Len() == 0 {
			t.Errorf("%v: exit %d, stderr %q; want 2 and a message", args, code, errs.String())
		}
		checkFits(t, fmt.Sprint(args), errs.String())
	}
	var out, errs bytes.Buffer
	if code := run(context.Background(), []string{"--help"}, &out, &errs, noEnv); code != 0 || !strings.Contains(errs.String(), "-algorithm") {
		t.Errorf("--help: exit %d, %q", code, errs.String())
	}
	checkFits(t, "--help", errs.String())
	for _, name := range []string{"-tasks", "gcra", "fixed-window", "(default 30s)"} {
		if !strings.Contains(errs.String(), name) {
			t.Errorf("--help lacks %q:\n%s", name, errs.String())
		}
	}
}
