package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// binary is throttlectl, built once for all the tests: they run it as an
// operator would.
var binary string

// raceEnabled is set by race_test.go when the tests run with -race: the
// binary is then built with it too.
var raceEnabled bool

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "throttlectl-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "throttlectl")
	args := []string{"build", "-o", binary}
	if raceEnabled {
		args = append(args, "-race")
	}
	build := exec.Command(goTool(), append(args, ".")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building throttlectl:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	// A binary built with -race sleeps a second as it exits, for late race
	// reports: every run of throttlectl took 1 s, and the package's tests
	// half a minute. Races found while it ran are still reported.
	os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// goTool returns the go command on the PATH, or the one of the toolchain
// that built the tests (GOROOT, as go test sets it).
func goTool() string {
	if path, err := exec.LookPath("go"); err == nil {
		return path
	}
	return filepath.Join(os.Getenv("GOROOT"), "bin", "go")
}

// cli runs throttlectl against one test's Redis, under its key prefix.
type cli struct {
	t      *testing.T
	tg     *redistest.Target
	global []string // --redis, --cluster and --prefix for tg
}

// newCLI returns a cli on the Redis the environment names: embedded by
// default, REDIS_ADDR or REDIS_CLUSTER_ADDRS.
func newCLI(t *testing.T) *cli {
	t.Helper()
	tg := redistest.New(t)
	var global []string
	switch tg.Kind {
	case "miniredis":
		global = []string{"--redis", tg.Mini.Addr()}
	case "redis":
		global = []string{"--redis", os.Getenv("REDIS_ADDR")}
	case "cluster":
		global = []string{"--cluster", "--redis", os.Getenv("REDIS_CLUSTER_ADDRS")}
	default:
		t.Fatalf("unknown Redis kind %q", tg.Kind)
	}
	return &cli{t: t, tg: tg, global: append(global, "--prefix", tg.Prefix)}
}

// result is one run of the binary.
type result struct {
	args           []string
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return fmt.Sprintf("throttlectl %q: exit %d\nstdout:\n%s\nstderr:\n%s", r.args, r.code, r.stdout, r.stderr)
}

// run runs throttlectl with the target's global flags, then args.
func (c *cli) run(args ...string) result {
	c.t.Helper()
	return runBinary(c.t, append(append([]string{}, c.global...), args...)...)
}

// runBinary runs throttlectl with exactly args.
func runBinary(t *testing.T, args ...string) result {
	t.Helper()
	return runBinaryEnv(t, nil, args...)
}

// runBinaryEnv runs throttlectl with exactly args, and env ("NAME=value")
// over the test's environment.
func runBinaryEnv(t *testing.T, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{args: args, stdout: stdout.String(), stderr: stderr.String()}
	if exit, ok := err.(*exec.ExitError); ok {
		r.code = exit.ExitCode()
	} else if err != nil {
		t.Fatalf("running throttlectl %q: %v", args, err)
	}
	return r
}

// ok runs throttlectl and fails the test unless it succeeds silently on
// stderr.
func (c *cli) ok(args ...string) result {
	c.t.Helper()
	r := c.run(args...)
	if r.code != 0 || r.stderr != "" {
		c.t.Fatalf("want success: %v", r)
	}
	return r
}

// okJSON runs throttlectl --json and decodes its output into v, checking
// that it is exactly one JSON document.
func (c *cli) okJSON(v any, args ...string) result {
	c.t.Helper()
	r := c.ok(append([]string{"--json"}, args...)...)
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		c.t.Fatalf("decoding the JSON: %v\n%v", err, r)
	}
	if dec.More() {
		c.t.Fatalf("more than one JSON document:\n%v", r)
	}
	return r
}

// full checks that r succeeded for a key with no state in Redis: stdout
// shows it full, and one note on stderr, "throttlectl: note: ..."
// containing says.
func full(t *testing.T, r result, says string) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
	switch {
	case r.code != 0:
		t.Errorf("want success: %v", r)
	case len(lines) != 1 || !strings.HasPrefix(r.stderr, "throttlectl: note: "):
		t.Errorf("want one line \"throttlectl: note: ...\" on stderr: %v", r)
	case !strings.Contains(r.stderr, says) || !strings.Contains(r.stderr, "it is full"):
		t.Errorf("stderr does not say %q and that the key is full: %v", says, r)
	case r.stdout == "":
		t.Errorf("nothing on stdout: %v", r)
	}
}

// fails checks that r failed with status code and exactly one line on
// stderr, "throttlectl: ..." containing says, and nothing on stdout.
func fails(t *testing.T, r result, code int, says string) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
	switch {
	case r.code != code:
		t.Errorf("want exit %d: %v", code, r)
	case len(lines) != 1 || !strings.HasSuffix(r.stderr, "\n") || !strings.HasPrefix(r.stderr, "throttlectl: "):
		t.Errorf("want one line \"throttlectl: ...\" on stderr: %v", r)
	case !strings.Contains(r.stderr, says):
		t.Errorf("stderr does not say %q: %v", says, r)
	case r.stdout != "":
		t.Errorf("want nothing on stdout: %v", r)
	}
}

// peekJSON is peek's --json output as a script would read it.
type peekJSON struct {
	Key     string `json:"key"`
	Limiter string `json:"limiter"`
	// PolicySource: where the policy comes from.
	PolicySource string   `json:"policy_source"`
	Rules        []string `json:"rules"`
	RedisKey     string   `json:"redis_key"`
	Policy       string   `json:"policy"`
	Kind         string   `json:"kind"`
	peekLimits
	Throttled      bool   `json:"throttled"`
	Allowed        bool   `json:"allowed"`
	Limit          int    `json:"limit"`
	Remaining      int    `json:"remaining"`
	Holders        *int   `json:"holders"`
	RetryAfter     string `json:"retry_after"`
	RetryAfterUS   int64  `json:"retry_after_us"`
	ResetAfter     string `json:"reset_after"`
	ResetAfterUS   int64  `json:"reset_after_us"`
	BlockedFor     string `json:"blocked_for"`
	BlockedForUS   int64  `json:"blocked_for_us"`
	Waiting        int    `json:"waiting"`
	ExpectedWait   string `json:"expected_wait"`
	ExpectedWaitUS int64  `json:"expected_wait_us"`
	Flows          []struct {
		Flow           string `json:"flow"`
		Waiting        int    `json:"waiting"`
		First          int    `json:"first"`
		ExpectedWait   string `json:"expected_wait"`
		ExpectedWaitUS int64  `json:"expected_wait_us"`
	} `json:"flows"`
	Shares *struct {
		RestRatePerSecond float64 `json:"rest_rate_per_second"`
		RestBurst         float64 `json:"rest_burst"`
		RestTokens        float64 `json:"rest_tokens"`
		Holders           []struct {
			Holder          string  `json:"holder"`
			RatePerSecond   float64 `json:"rate_per_second"`
			Burst           float64 `json:"burst"`
			EndsIn          string  `json:"ends_in"`
			EndsInUS        int64   `json:"ends_in_us"`
			DemandPerSecond float64 `json:"demand_per_second"`
		} `json:"holders"`
	} `json:"shares"`
}

// peekLimits are the policy's numbers in peek's --json output.
type peekLimits struct {
	Rate          string  `json:"rate"`
	RatePerSecond float64 `json:"rate_per_second"`
	Burst         int     `json:"burst"`
	Capacity      int     `json:"capacity"`
	Window        string  `json:"window"`
	WindowUS      int64   `json:"window_us"`
	Period        string  `json:"period"`
	Lease         string  `json:"lease"`
	LeaseUS       int64   `json:"lease_us"`
}

// checkDurations checks that each duration's two forms agree.
func (p peekJSON) checkDurations(t *testing.T) {
	t.Helper()
	for _, d := range []struct {
		text string
		us   int64
	}{{p.RetryAfter, p.RetryAfterUS}, {p.ResetAfter, p.ResetAfterUS}, {p.BlockedFor, p.BlockedForUS}} {
		got, err := time.ParseDuration(d.text)
		if err != nil || got != time.Duration(d.us)*time.Microsecond {
			t.Errorf("%s: duration %q and %d µs disagree", p.Key, d.text, d.us)
		}
	}
}

// limiter returns a Limiter for p under the target's prefix, named after
// its policy's short form (see pol).
func (c *cli) limiter(p throttle.Policy) *throttle.Limiter {
	c.t.Helper()
	return c.namedLimiter(p.String(), p)
}

// namedLimiter returns the Limiter called name, of p, under the target's
// prefix.
func (c *cli) namedLimiter(name string, p throttle.Policy) *throttle.Limiter {
	c.t.Helper()
	l, err := throttle.New(c.tg.Client, name, p, throttle.WithPrefix(c.tg.Prefix))
	if err != nil {
		c.t.Fatal(err)
	}
	return l
}

// concurrency returns a ConcurrencyLimiter for p under the target's
// prefix, named after its policy's short form (see pol).
func (c *cli) concurrency(p throttle.Concurrency) *throttle.ConcurrencyLimiter {
	c.t.Helper()
	return c.namedConcurrency(concName(p), p)
}

// namedConcurrency returns the ConcurrencyLimiter called name, of p, under
// the target's prefix.
func (c *cli) namedConcurrency(name string, p throttle.Concurrency) *throttle.ConcurrencyLimiter {
	c.t.Helper()
	l, err := throttle.NewConcurrencyLimiter(c.tg.Client, name, p, throttle.WithPrefix(c.tg.Prefix))
	if err != nil {
		c.t.Fatal(err)
	}
	return l
}

// waitRegistered waits until n limiter names are in the registry of names
// under the target's prefix: a limiter records its name in the
// background after its first decision.
func (c *cli) waitRegistered(n int64) {
	c.t.Helper()
	waitRegistered(c.t, c.tg.Client, c.tg.Prefix, n)
}

// waitRegistered waits until n limiter names are in the registry of names
// under prefix.
func waitRegistered(t *testing.T, client redis.UniversalClient, prefix string, n int64) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		got, err := client.HLen(context.Background(), keyspace.Registry(prefix)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d limiter names registered under %q after 5s, want %d", got, prefix, n)
		}
	}
}

// concName names a test's concurrency limiter after its policy.
func concName(p throttle.Concurrency) string { return fmt.Sprintf("conc:%d/%s", p.Limit, p.Lease) }

// pol returns the name the tests' limiters of the policy written form
// have (c.limiter, c.concurrency), for --name; form itself when it is not
// a policy (a test of bad input).
func pol(form string) string {
	var limit int
	var lease string
	if n, _ := fmt.Sscanf(form, "conc:%d/%s", &limit, &lease); n == 2 {
		if d, err := time.ParseDuration(lease); err == nil {
			return concName(throttle.Concurrency{Limit: limit, Lease: d})
		}
	}
	if p, err := throttle.ParsePolicy(form); err == nil {
		return p.String()
	}
	return form
}

// take admits n units of key, which must pass.
func take(t *testing.T, l *throttle.Limiter, key string, n int) {
	t.Helper()
	r, err := l.AllowN(context.Background(), key, n)
	if err != nil || !r.Allowed {
		t.Fatalf("AllowN(%q, %d) = %+v, %v", key, n, r, err)
	}
}

// acquire takes a slot of key until the test ends.
func acquire(t *testing.T, c *throttle.ConcurrencyLimiter, key string) {
	t.Helper()
	lease, r, err := c.Acquire(context.Background(), key)
	if err != nil || lease == nil {
		t.Fatalf("Acquire(%q) = %+v, %v", key, r, err)
	}
	t.Cleanup(func() { _ = lease.Release(context.Background()) })
}

// tableRows splits a table into its rows of cells; cells hold no spaces
// (keys that would are quoted, and the tests use none).
func tableRows(t *testing.T, out string) [][]string {
	t.Helper()
	var rows [][]string
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		rows = append(rows, strings.Fields(line))
	}
	if len(rows) < 1 {
		t.Fatalf("no table in %q", out)
	}
	return rows
}
