package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/throttle"
)

// decade is a window so long that no test meets one of its boundaries
// (windows are aligned to the Unix epoch).
const decade = 87600 * time.Hour

// TestThrottlectlPeek takes units from keys of every policy type, then
// peeks them as table and as JSON: the remaining units are exact.
func TestThrottlectlPeek(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	for _, tc := range []struct {
		name      string
		policy    throttle.Policy
		flag      string // --policy as an operator writes it
		id        string // as the library writes it
		caller    string
		take      int
		remaining int
		limit     int
		period    time.Duration // how long the retry-after may be, when throttled
		limits    peekLimits    // the policy's numbers in the JSON
		columns   string        // the table's two columns of them: headers, then cells
	}{
		{"gcra", throttle.GCRA{Rate: throttle.PerHour(10), Burst: 5}, "gcra:10/60m:5", "gcra:10/1h:5", "tenant-42", 2, 3, 5, 0,
			peekLimits{Rate: "10/1h", RatePerSecond: 10.0 / 3600, Burst: 5}, "RATE BURST 10/1h 5"},
		{"gcra full", throttle.GCRA{Rate: throttle.PerHour(10), Burst: 5}, "gcra:10/1h0m0s:5", "gcra:10/1h:5", "tenant{7}%", 5, 0, 5, 6 * time.Minute,
			peekLimits{Rate: "10/1h", RatePerSecond: 10.0 / 3600, Burst: 5}, "RATE BURST 10/1h 5"},
		{"gcra per hour as the docs write it", throttle.GCRA{Rate: throttle.PerHour(10), Burst: 1}, "gcra:10/h:1", "gcra:10/1h:1", "tenant-6", 1, 0, 1, 6 * time.Minute,
			peekLimits{Rate: "10/1h", RatePerSecond: 10.0 / 3600, Burst: 1}, "RATE BURST 10/1h 1"},
		{"token bucket", throttle.TokenBucket{Rate: throttle.Rate{N: 3, Per: 90 * time.Minute}, Burst: 4}, "tb:3/90m:4", "tb:3/1h30m:4", "tenant-1", 4, 0, 4, 30 * time.Minute,
			peekLimits{Rate: "3/1h30m", RatePerSecond: 3.0 / 5400, Burst: 4}, "RATE BURST 3/1h30m 4"},
		{"leaky bucket", throttle.LeakyBucket{Rate: throttle.PerHour(5), Capacity: 5}, "lb:5/1h:5", "lb:5/1h:5", "tenant-2", 1, 4, 5, 0,
			peekLimits{Rate: "5/1h", RatePerSecond: 5.0 / 3600, Capacity: 5}, "RATE CAPACITY 5/1h 5"},
		{"fixed window", throttle.FixedWindow{Limit: 25, Window: decade}, "fw:25/87600h", "fw:25/87600h", "tenant-3", 7, 18, 25, 0,
			peekLimits{Rate: "25/87600h", RatePerSecond: 25 / decade.Seconds(), Window: "87600h0m0s", WindowUS: decade.Microseconds()}, "LIMIT WINDOW 25 87600h"},
		{"sliding log", throttle.SlidingLog{Limit: 3, Window: time.Hour}, "sl:3/h", "sl:3/1h", "tenant-4", 3, 0, 3, time.Hour,
			peekLimits{Rate: "3/1h", RatePerSecond: 3.0 / 3600, Window: "1h0m0s", WindowUS: time.Hour.Microseconds()}, "LIMIT WINDOW 3 1h"},
		{"sliding window", throttle.SlidingWindow{Limit: 100, Window: decade}, "sw:100/87600h", "sw:100/87600h", "tenant-5", 40, 60, 100, 0,
			peekLimits{Rate: "100/87600h", RatePerSecond: 100 / decade.Seconds(), Window: "87600h0m0s", WindowUS: decade.Microseconds()}, "LIMIT WINDOW 100 87600h"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := c.limiter(tc.policy)
			take(t, l, tc.caller, tc.take)
			var got peekJSON
			c.okJSON(&got, "peek", "--name", pol(tc.flag), "--policy", tc.flag, tc.caller)
			throttled := tc.remaining == 0
			if got.Key != tc.caller || got.RedisKey != l.Key(tc.caller) || got.Policy != tc.id || got.Kind != "rate" ||
				got.Remaining != tc.remaining || got.Limit != tc.limit || got.Allowed == throttled || got.Throttled != throttled ||
				got.Holders != nil || got.BlockedForUS != 0 || got.ResetAfterUS <= 0 {
				t.Errorf("peek --json: %+v", got)
			}
			if got.peekLimits != tc.limits {
				t.Errorf("peek --json shows the policy as %+v, want %+v", got.peekLimits, tc.limits)
			}
			if retry := time.Duration(got.RetryAfterUS) * time.Microsecond; throttled && (retry <= tc.period-time.Minute || retry > tc.period) ||
				!throttled && retry != 0 {
				t.Errorf("retry-after %s, want 0 or just under %s", retry, tc.period)
			}
			got.checkDurations(t)

			r := c.ok("peek", "--name", pol(tc.flag), "--policy", tc.flag, tc.caller)
			columns := strings.Fields(tc.columns)
			rows := checkTable(t, r.stdout, "KEY", "LIMITER", "POLICY", "FROM", columns[0], columns[1], "ALLOWED", "REMAINING", "RETRY-AFTER", "RESET-AFTER", "BLOCKED-FOR")
			want := []string{tc.caller, l.Name(), tc.id, "--policy", columns[2], columns[3], map[bool]string{true: "no", false: "yes"}[throttled], itoa(tc.remaining) + "/" + itoa(tc.limit)}
			if len(rows) != 2 || strings.Join(rows[1][:8], " ") != strings.Join(want, " ") || rows[1][10] != "0s" {
				t.Errorf("peek table rows %q, want a row starting %q", rows, want)
			}
		})
	}
}

// TestThrottlectlPeekConcurrency shows a concurrency cap's holders and free
// slots, then the cap full.
func TestThrottlectlPeekConcurrency(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	exports := c.concurrency(throttle.Concurrency{Limit: 3, Lease: time.Hour})
	acquire(t, exports, "tenant-9")
	acquire(t, exports, "tenant-9")

	var got peekJSON
	c.okJSON(&got, "peek", "--name", pol("conc:3/1h"), "--policy", "conc:3/1h", "tenant-9")
	if got.Kind != "concurrency" || got.Policy != "conc:3/1h0m0s" || got.Holders == nil || *got.Holders != 2 ||
		got.peekLimits != (peekLimits{Lease: "1h0m0s", LeaseUS: time.Hour.Microseconds()}) ||
		got.Remaining != 1 || got.Limit != 3 || !got.Allowed || got.Throttled || got.RedisKey != exports.Key("tenant-9") {
		t.Errorf("peek --json: %+v", got)
	}
	r := c.ok("peek", "--name", pol("conc:3/1h"), "--policy", "conc:3/1h", "tenant-9")
	rows := checkTable(t, r.stdout, "KEY", "LIMITER", "POLICY", "FROM", "ALLOWED", "HOLDERS", "FREE", "RETRY-AFTER", "RESET-AFTER")
	if want := "tenant-9 conc:3/1h0m0s conc:3/1h0m0s --policy yes 2/3 1 0s"; len(rows) != 2 || strings.Join(rows[1][:8], " ") != want {
		t.Errorf("peek table rows %q, want %q", rows, want)
	}

	acquire(t, exports, "tenant-9")
	c.okJSON(&got, "peek", "--name", pol("conc:3/1h"), "--policy", "conc:3/1h", "tenant-9")
	if *got.Holders != 3 || got.Remaining != 0 || got.Allowed || !got.Throttled || got.RetryAfterUS <= int64((59*time.Minute).Microseconds()) {
		t.Errorf("peek --json of a full cap: %+v", got)
	}
}

// TestThrottlectlPeekBlocked peeks keys blocked by BlockFor: a window,
// whose block lives beside its (absent) state, and a meter.
func TestThrottlectlPeekBlocked(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	for _, p := range []throttle.Policy{
		throttle.FixedWindow{Limit: 5, Window: decade},
		throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 5},
	} {
		l := c.limiter(p)
		if err := l.BlockFor(context.Background(), "tenant-b", 10*time.Minute); err != nil {
			t.Fatal(err)
		}
		var got peekJSON
		// The Redis key names the policy. Peek and BlockedFor are two calls:
		// the retry-after, read first, is a little longer.
		c.okJSON(&got, "peek", l.Key("tenant-b"))
		blocked := time.Duration(got.BlockedForUS) * time.Microsecond
		if got.Allowed || !got.Throttled || got.Remaining != 0 || blocked <= 9*time.Minute || blocked > 10*time.Minute ||
			got.RetryAfterUS < got.BlockedForUS || got.RetryAfterUS-got.BlockedForUS > 1e6 || got.Key != "tenant-b" {
			t.Errorf("%T: peek --json of a blocked key: %+v", p, got)
		}
	}
}

// TestThrottlectlReset resets keys, after which peek and reset find no
// state, and the keys admit again.
func TestThrottlectlReset(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	ctx := context.Background()
	gcra := c.limiter(throttle.GCRA{Rate: throttle.PerHour(1), Burst: 1})
	take(t, gcra, "tenant{1}", 1)
	window := c.limiter(throttle.SlidingWindow{Limit: 2, Window: decade})
	take(t, window, "tenant-2", 2)
	if err := window.BlockFor(ctx, "tenant-2", time.Hour); err != nil {
		t.Fatal(err)
	}
	exports := c.concurrency(throttle.Concurrency{Limit: 1, Lease: time.Hour})
	acquire(t, exports, "tenant-3")

	r := c.ok("reset", "--name", pol("gcra:1/1h:1"), "--policy", "gcra:1/1h:1", "tenant{1}")
	if !strings.HasPrefix(r.stdout, "reset tenant{1} of the limiter gcra:1/1h:1, gcra:1/1h:1 (rate 1/1h, burst 1; ") || !strings.Contains(r.stdout, "it had 0/1 remaining") {
		t.Errorf("reset says %q", r.stdout)
	}
	var got struct {
		Reset bool `json:"reset"`
		peekJSON
	}
	c.okJSON(&got, "reset", "--name", pol("sw:2/87600h"), "--policy", "sw:2/87600h", "tenant-2")
	if !got.Reset || got.Key != "tenant-2" || !got.Throttled || got.BlockedForUS == 0 || got.RedisKey != window.Key("tenant-2") {
		t.Errorf("reset --json: %+v", got)
	}
	c.ok("reset", exports.Key("tenant-3")) // the Redis key names the policy

	for _, tc := range []struct {
		policy, caller, redisKey string
	}{
		{"gcra:1/1h:1", "tenant{1}", gcra.Key("tenant{1}")},
		{"sw:2/87600h", "tenant-2", window.Key("tenant-2")},
		{"conc:1/1h", "tenant-3", exports.Key("tenant-3")},
	} {
		for _, command := range []string{"peek", "reset"} {
			full(t, c.run(command, "--name", pol(tc.policy), "--policy", tc.policy, tc.caller), "key "+quote(tc.caller))
		}
		if n, err := c.tg.Client.Exists(ctx, tc.redisKey, tc.redisKey+":block").Result(); err != nil || n != 0 {
			t.Errorf("%s: %d keys left after reset, %v", tc.redisKey, n, err)
		}
	}
	take(t, gcra, "tenant{1}", 1)
	take(t, window, "tenant-2", 2)
}

// TestThrottlectlConfig names limiters from a config file.
func TestThrottlectlConfig(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	config := filepath.Join(t.TempDir(), "limits.json")
	writeJSON(t, config, map[string]string{"tenant": "gcra:10/1h:5", "exports": "conc:2/1h", "nightly": "fw:50/87600h"})
	take(t, c.namedLimiter("tenant", throttle.GCRA{Rate: throttle.PerHour(10), Burst: 5}), "tenant-42", 4)
	acquire(t, c.namedConcurrency("exports", throttle.Concurrency{Limit: 2, Lease: time.Hour}), "tenant-42")

	var got peekJSON
	c.okJSON(&got, "peek", "--config", config, "--limiter", "tenant", "tenant-42")
	if got.Policy != "gcra:10/1h:5" || got.Remaining != 1 {
		t.Errorf("peek --limiter tenant: %+v", got)
	}
	c.okJSON(&got, "peek", "--config", config, "--limiter", "exports", "tenant-42")
	if got.Policy != "conc:2/1h0m0s" || *got.Holders != 1 {
		t.Errorf("peek --limiter exports: %+v", got)
	}
	c.ok("reset", "--config", config, "--limiter", "tenant", "tenant-42")
	full(t, c.run("peek", "--config", config, "--limiter", "tenant", "tenant-42"), `no state for tenant@gcra key "tenant-42"`)
	full(t, c.run("peek", "--config", config, "--limiter", "nightly", "tenant-42"), "state present under: exports@conc")
}

// TestThrottlectlFlagsAnywhere: flags may follow the key, global flags may
// follow the command, and "--" ends the flags.
func TestThrottlectlFlagsAnywhere(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	take(t, c.limiter(throttle.GCRA{Rate: throttle.PerHour(10), Burst: 5}), "-dash", 1)
	take(t, c.limiter(throttle.GCRA{Rate: throttle.PerHour(10), Burst: 5}), "tenant-1", 2)
	global := c.global
	c.global = nil
	var got peekJSON
	c.okJSON(&got, append(append([]string{"peek", "tenant-1"}, global...), "--name", pol("gcra:10/1h:5"), "--policy", "gcra:10/1h:5")...)
	if got.Key != "tenant-1" || got.Remaining != 3 {
		t.Errorf("peek KEY --flags: %+v", got)
	}
	c.okJSON(&got, append(append([]string{"peek", "--name", pol("gcra:10/1h:5"), "--policy", "gcra:10/1h:5"}, global...), "--", "-dash")...)
	if got.Key != "-dash" || got.Remaining != 4 {
		t.Errorf("peek -- -dash: %+v", got)
	}
}

// checkTable checks that out is an aligned table with the given header and
// returns its rows: every cell starts where its column's header does.
func checkTable(t *testing.T, out string, header ...string) [][]string {
	t.Helper()
	rows := tableRows(t, out)
	if strings.Join(rows[0], " ") != strings.Join(header, " ") {
		t.Fatalf("table header %q, want %q", rows[0], header)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	starts := cellStarts(lines[0])
	for _, line := range lines[1:] {
		got := cellStarts(line)
		if len(got) != len(starts) {
			t.Fatalf("row %q has %d cells, the header %d", line, len(got), len(starts))
		}
		for i := range got {
			if got[i] != starts[i] {
				t.Fatalf("table not aligned:\n%s", out)
			}
		}
	}
	return rows
}

// cellStarts returns the columns (in runes, as tabwriter counts) at which
// a line's cells start.
func cellStarts(line string) []int {
	var starts []int
	column, previous := 0, ' '
	for _, r := range line {
		if r != ' ' && previous == ' ' {
			starts = append(starts, column)
		}
		column++
		previous = r
	}
	return starts
}

func itoa(n int) string { return strconv.Itoa(n) }

func quote(s string) string { return strconv.Quote(s) }

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestThrottlectlPeekShowsLeasedShares: two processes holding shares of a
// key (WithLeasedShares) show in peek, table and JSON: each holder's
// share, its lease's end and its demand, and the rest Redis decides; the
// shares add up to at most the policy.
func TestThrottlectlPeekShowsLeasedShares(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	policy := throttle.GCRA{Rate: throttle.PerSecond(100), Burst: 10}
	var ls []*throttle.Limiter
	for range 2 {
		l, err := throttle.New(c.tg.NewClient(t), "leased-peek", policy, throttle.WithPrefix(c.tg.Prefix), throttle.WithLeasedShares(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close(context.Background())
		ls = append(ls, l)
	}
	held := map[int]bool{}
	for deadline := time.Now().Add(10 * time.Second); len(held) < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the two processes hold no shares after 10 s at 100 asks a second each")
		}
		for i, l := range ls {
			r, err := l.Allow(context.Background(), "k")
			if err != nil {
				t.Fatal(err)
			}
			if r.Leased {
				held[i] = true
			}
		}
	}
	var got peekJSON
	c.okJSON(&got, "peek", "--name", "leased-peek", "k")
	if got.Shares == nil || len(got.Shares.Holders) != 2 {
		t.Fatalf("peek --json shows shares %+v, want two holders", got.Shares)
	}
	rate, burst := got.Shares.RestRatePerSecond, got.Shares.RestBurst
	for _, h := range got.Shares.Holders {
		if h.RatePerSecond <= 0 || h.Burst < 1 || h.EndsInUS <= 0 || h.EndsInUS > time.Second.Microseconds() || h.DemandPerSecond <= 0 || h.Holder == "" {
			t.Errorf("holder %+v", h)
		}
		rate += h.RatePerSecond
		burst += h.Burst
	}
	if rate > 100+1e-9 || burst > 10+1e-9 {
		t.Errorf("the shares and the rest add up to %g/s, burst %g; the policy is 100/s, burst 10", rate, burst)
	}
	r := c.ok("peek", "--name", "leased-peek", "k")
	if !strings.Contains(r.stdout, "2 processes hold shares of the key's rate") || !strings.Contains(r.stdout, "LEASE-ENDS-IN") {
		t.Errorf("peek's table shows no shares:\n%s", r.stdout)
	}
	t.Logf("figures: %s", strings.TrimSpace(r.stdout))
	// top --all finds the key by its shares' key, and reads the rest.
	top := c.ok("top", "--all")
	if !slices.ContainsFunc(strings.Split(top.stdout, "\n"), func(line string) bool {
		f := strings.Fields(line)
		return len(f) > 2 && f[0] == "k" && f[1] == "leased-peek" && f[2] == "gcra:100/1s:10"
	}) {
		t.Errorf("top does not list the leased key:\n%s", top.stdout)
	}
}
