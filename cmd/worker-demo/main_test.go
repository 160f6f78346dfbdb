package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// TestDemoHoldsThePolicy runs the demo as CI and a newcomer would, with a
// short duration, on the Redis the environment names (embedded by default).
func TestDemoHoldsThePolicy(t *testing.T) {
	args := []string{"--duration", "20s", "--tasks", "120", "--batch", "20", "--exports", "4"}
	if addr := os.Getenv("REDIS_ADDR"); addr != "" {
		args = append(args, "--redis", addr)
	}
	var out, errs bytes.Buffer
	code := run(args, &out, &errs)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errs.String())
	}
	for _, want := range []string{
		"ok    every task processed exactly once: 144 of 144 tasks ran, 0 more than once",
		"its fair share", // measured, not skipped for a short backlog
		"ok    asynq: 0 failed, 0 archived",
		"The fleet held the policy.",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}
	// Not a terminal: plain lines, no cursor movement.
	if strings.Contains(out.String(), "\033[") {
		t.Error("escape sequences in output that is not a terminal")
	}
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
		if code := run(args, &out, &errs); code != 2 || errs.Len() == 0 {
			t.Errorf("%v: exit %d, stderr %q; want 2 and a message", args, code, errs.String())
		}
	}
	var out, errs bytes.Buffer
	if code := run([]string{"--help"}, &out, &errs); code != 0 || !strings.Contains(errs.String(), "-algorithm") {
		t.Errorf("--help: exit %d, %q", code, errs.String())
	}
}
