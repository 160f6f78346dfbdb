package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// TestThrottlectlBadInput: every mistake exits non-zero with one line on
// stderr, 2 for the command line and 1 for what went wrong at run time.
func TestThrottlectlBadInput(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	take(t, c.limiter(throttle.GCRA{Rate: throttle.PerHour(1), Burst: 1}), "tenant-1", 1)
	dir := t.TempDir()
	config := filepath.Join(dir, "limits.json")
	writeJSON(t, config, map[string]string{"tenant": "gcra:1/1h:1", "broken": "gcra:1/1h"})
	notJSON := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(notJSON, []byte("tenant: gcra:1/1h:1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	closed, silent := redistest.DeadAddr(t), redistest.SilentAddr(t)
	hashed := c.tg.Prefix + "gcra:1/1h:1@gcra:{%#" + strings.Repeat("ab", 32) + "}"
	peek := []string{"peek", "--name", pol("gcra:1/1h:1"), "--policy", "gcra:1/1h:1"}
	unreachable := "cannot reach Redis at "
	if c.tg.Kind == "cluster" {
		unreachable = "cannot reach Redis Cluster at "
	}

	for _, tc := range []struct {
		name string
		args []string // after the target's global flags
		code int
		says string
	}{
		{"no command", nil, exitUsage, "no command"},
		{"unknown command", []string{"frobnicate"}, exitUsage, `unknown command "frobnicate"`},
		{"unknown global flag", []string{"--frob", "top"}, exitUsage, "flag provided but not defined: -frob"},
		{"unknown flag", []string{"peek", "--frob", "tenant-1"}, exitUsage, "flag provided but not defined: -frob"},
		{"bad flag value", []string{"--timeout", "soon", "top"}, exitUsage, `invalid value "soon" for flag -timeout`},
		{"zero timeout", []string{"top", "--timeout", "0s"}, exitUsage, "--timeout must be positive"},
		{"address without port", bare("--redis", "localhost", "top"), exitUsage, `--redis "localhost": want host:port`},
		{"bad port", bare("--redis", "localhost:99999", "top"), exitUsage, `bad port "99999"`},
		{"bad seed", bare("--cluster", "--redis", "127.0.0.1:7000,nowhere", "top"), exitUsage, `seed "nowhere": want host:port`},
		{"seeds without --cluster", bare("--redis", "127.0.0.1:7000,127.0.0.1:7001", "top"), exitUsage, "needs --cluster"},
		{"bad URL port", bare("--redis", "redis://ops:s3cret@127.0.0.1:bad", "top"), exitUsage, `--redis "redis://ops:xxxxx@127.0.0.1:bad": bad URL: invalid port`},
		{"bad URL scheme", bare("--redis", "http://127.0.0.1:6379", "top"), exitUsage, "invalid URL scheme: http"},
		{"bad database", bare("--redis", "redis://127.0.0.1:6379/zero", "top"), exitUsage, "invalid database number"},
		{"unknown URL option", bare("--redis", "redis://127.0.0.1:6379?frob=1", "top"), exitUsage, "unexpected option: frob"},
		{"cluster URL with a database", bare("--cluster", "--redis", "redis://127.0.0.1:7000/2", "top"), exitUsage, "only database 0"},
		{"cluster URLs with commas", bare("--cluster", "--redis", "redis://127.0.0.1:7000,redis://127.0.0.1:7001", "top"), exitUsage, "?addr=host:port"},
		{"nobody listening", append([]string{"--redis", closed}, append(peek, "tenant-1")...), exitFailure, unreachable + closed},
		{"nobody answering", []string{"--redis", silent, "--timeout", "300ms", "top"}, exitFailure, unreachable + silent},
		{"prefix with a brace", []string{"--prefix", "a{b", "top"}, exitUsage, "--prefix"},
		{"malformed policy", []string{"peek", "--name", pol("gcra:10/1s"), "--policy", "gcra:10/1s", "tenant-1"}, exitUsage, "--policy: throttle: invalid policy"},
		{"invalid policy", []string{"peek", "--name", pol("gcra:10/1s:0"), "--policy", "gcra:10/1s:0", "tenant-1"}, exitUsage, "Burst must be at least 1"},
		{"unknown algorithm", []string{"reset", "--name", pol("token-bucket:10/1s:1"), "--policy", "token-bucket:10/1s:1", "tenant-1"}, exitUsage, "unknown kind"},
		{"missing key", peek, exitUsage, "peek: missing KEY"},
		{"missing key to reset", []string{"reset", "--name", pol("gcra:1/1h:1"), "--policy", "gcra:1/1h:1"}, exitUsage, "reset: missing KEY"},
		{"empty key", append(peek, ""), exitUsage, "peek: empty KEY"},
		{"two keys", append(peek, "tenant-1", "tenant-2"), exitUsage, "want one KEY, got 2"},
		{"no policy", []string{"peek", "tenant-1"}, exitUsage, "name its limiter with --name"},
		{"policy and config", []string{"peek", "--name", pol("gcra:1/1h:1"), "--policy", "gcra:1/1h:1", "--config", config, "--limiter", "tenant", "tenant-1"}, exitUsage, "not both"},
		{"limiter without config", []string{"peek", "--limiter", "tenant", "tenant-1"}, exitUsage, "--limiter needs --config"},
		{"config without limiter", []string{"peek", "--config", config, "tenant-1"}, exitUsage, "--config needs --limiter"},
		{"missing config", []string{"peek", "--config", filepath.Join(dir, "nope.json"), "--limiter", "tenant", "tenant-1"}, exitUsage, "no such file"},
		{"config not JSON", []string{"peek", "--config", notJSON, "--limiter", "tenant", "tenant-1"}, exitUsage, "want a JSON object"},
		{"unknown limiter", []string{"peek", "--config", config, "--limiter", "exports", "tenant-1"}, exitUsage, `has no limiter "exports" (it has ["broken" "tenant"])`},
		{"bad policy in config", []string{"peek", "--config", config, "--limiter", "broken", "tenant-1"}, exitUsage, `limiter "broken": throttle: invalid policy`},
		{"hashed Redis key", []string{"peek", hashed}, exitUsage, "stored by its hash"},
		{"top with an argument", []string{"top", "tenant-1"}, exitUsage, "top: takes no arguments"},
		{"negative limit", []string{"top", "--limit", "-1"}, exitUsage, "--limit must not be negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if len(tc.args) > 0 && tc.args[0] == bareMark {
				// an address refused before any connection: without the
				// target's flags, which say --cluster on a cluster
				fails(t, runBinary(t, tc.args[1:]...), tc.code, tc.says)
				return
			}
			fails(t, c.run(tc.args...), tc.code, tc.says)
		})
	}
}

// bare marks the arguments of a case of TestThrottlectlBadInput whose
// --redis is refused as written: run without the test target's global
// flags (a cluster target's include --cluster).
func bare(args ...string) []string { return append([]string{bareMark}, args...) }

const bareMark = "<bare>"

// TestThrottlectlHelp: --help lists the commands and the flags with their
// defaults, on stdout, and exits 0.
func TestThrottlectlHelp(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		says []string
	}{
		{[]string{"--help"}, []string{"usage: throttlectl", "peek", "reset", "top", "-redis address", "$REDIS_URL", "rediss://", `(default "throttle:")`, "(default 5s)", "-cluster", "-json"}},
		{[]string{"help"}, []string{"usage: throttlectl", "-prefix prefix"}},
		{[]string{"peek", "--help"}, []string{"usage: throttlectl [global flags] peek", "-policy policy", "-config file", "-limiter name", "-redis"}},
		{[]string{"reset", "-h"}, []string{"usage: throttlectl [global flags] reset", "-policy policy"}},
		{[]string{"top", "--help"}, []string{"usage: throttlectl [global flags] top", "-all", "-limit N", "-timeout"}},
	} {
		r := runBinary(t, tc.args...)
		if r.code != 0 || r.stderr != "" {
			t.Errorf("want exit 0 and nothing on stderr: %v", r)
		}
		for _, s := range tc.says {
			if !strings.Contains(r.stdout, s) {
				t.Errorf("%q: help lacks %q:\n%s", tc.args, s, r.stdout)
			}
		}
	}
}
