package main

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
)

// topScene is keys of every kind under one prefix: five throttled ones
// (three used up, one blocked, a full concurrency cap), three that are not
// (one of them with a reservation), and keys of the worker and
// the scheduler that no limiter wrote.
type topScene struct {
	throttled []topEntry // longest wait first
	free      []topEntry
}

type topEntry struct {
	key, policy string
	remaining   int
	rateBurst   string // top's RATE and BURST cells
}

func newTopScene(t *testing.T, c *cli) topScene {
	t.Helper()
	ctx := context.Background()
	var s topScene

	// Used up: waits of about 2h, 1h and 30m.
	take(t, c.limiter(throttle.GCRA{Rate: throttle.Rate{N: 1, Per: 2 * time.Hour}, Burst: 1}), "tenant-a", 1)
	take(t, c.limiter(throttle.SlidingLog{Limit: 3, Window: time.Hour}), "tenant-b", 3)
	take(t, c.limiter(throttle.TokenBucket{Rate: throttle.PerHour(2), Burst: 2}), "tenant{c}", 2)
	// Blocked for 20m: a window keeps its block beside a state it may not
	// have.
	blocked := c.limiter(throttle.SlidingWindow{Limit: 10, Window: time.Hour})
	if err := blocked.BlockFor(ctx, "tenant-d", 20*time.Minute); err != nil {
		t.Fatal(err)
	}
	// A full concurrency cap: the oldest lease runs out in about 10m.
	exports := c.concurrency(throttle.Concurrency{Limit: 2, Lease: 10 * time.Minute})
	acquire(t, exports, "exports")
	acquire(t, exports, "exports")
	s.throttled = []topEntry{
		{"tenant-a", "gcra:1/2h:1", 0, "1/2h 1"},
		{"tenant-b", "sl:3/1h", 0, "3/1h -"},
		{"tenant{c}", "tb:2/1h:2", 0, "2/1h 2"},
		{"tenant-d", "sw:10/1h", 0, "10/1h -"},
		{"exports", "conc:2/10m0s", 0, "- -"},
	}

	take(t, c.limiter(throttle.FixedWindow{Limit: 5, Window: decade}), "tenant-f", 1)
	take(t, c.limiter(throttle.LeakyBucket{Rate: throttle.PerHour(5), Capacity: 5}), "tenant-g", 2)
	booked := c.limiter(throttle.GCRA{Rate: throttle.PerHour(10), Burst: 5})
	if r, err := booked.Reserve(ctx, "tenant-h", 1, time.Hour); err != nil || !r.OK {
		t.Fatalf("Reserve: %+v, %v", r, err)
	}
	s.free = []topEntry{
		{"tenant-f", "fw:5/87600h", 4, "5/87600h -"},
		{"tenant-g", "lb:5/1h:5", 3, "5/1h 5"},
		{"tenant-h", "gcra:10/1h:5", 4, "10/1h 5"},
	}

	for _, key := range []string{c.tg.Prefix + "worker:task:{task-1}", c.tg.Prefix + "sched:{nightly}:2026-03-14T02:00:00Z"} {
		if err := c.tg.Client.Set(ctx, key, "1", time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(c.tg.Keys(t)); n != 10 {
		t.Fatalf("%d keys under the prefix, want 10 (8 states or blocks, 2 of others)", n)
	}
	c.waitRegistered(8) // top reads the policies there
	return s
}

// TestThrottlectlTop lists exactly the throttled keys, longest wait first,
// as JSON and as a table; --all adds the others, --limit cuts the list.
func TestThrottlectlTop(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	scene := newTopScene(t, c)

	var got []peekJSON
	c.okJSON(&got, "top")
	checkTop(t, c, "top --json", got, scene.throttled, true)

	c.okJSON(&got, "top", "--all")
	if len(got) != 8 {
		t.Fatalf("top --all lists %d keys, want 8: %+v", len(got), got)
	}
	checkTop(t, c, "top --all --json (throttled part)", got[:5], scene.throttled, true)
	// The rest wait for nothing: their order depends on the clock.
	rest := map[string]peekJSON{}
	for _, g := range got[5:] {
		rest[g.Key] = g
	}
	for _, want := range scene.free {
		g, ok := rest[want.key]
		if !ok || g.Policy != want.policy || g.Remaining != want.remaining || g.Throttled || !g.Allowed {
			t.Errorf("top --all: %s is %+v, want %+v", want.key, g, want)
		}
	}

	c.okJSON(&got, "top", "--limit", "2")
	checkTop(t, c, "top --limit 2", got, scene.throttled[:2], true)

	r := c.ok("top")
	rows := checkTable(t, r.stdout, "KEY", "LIMITER", "POLICY", "FROM", "RATE", "BURST", "REMAINING", "RETRY-AFTER", "RESET-AFTER", "BLOCKED-FOR", "WAITING", "RULES")
	if len(rows) != 6 {
		t.Fatalf("top table has %d rows, want a header and 5:\n%s", len(rows), r.stdout)
	}
	for i, want := range scene.throttled {
		row := rows[i+1]
		got := strings.Join([]string{row[0], row[2], row[4], row[5]}, " ")
		if got != want.key+" "+want.policy+" "+want.rateBurst || row[1] != pol(want.policy) || row[3] != "code" {
			t.Errorf("top row %d: %q, want %s %s %s from code %s", i+1, row, want.key, pol(want.policy), want.policy, want.rateBurst)
		}
	}
	if blocked := rows[4][9]; !strings.HasPrefix(blocked, "19m") && blocked != "20m0s" {
		t.Errorf("top: tenant-d blocked for %q, want about 20m", blocked)
	}
	if rows[5][9] != "-" || rows[5][6] != "0/2" {
		t.Errorf("top: concurrency row %q", rows[5])
	}
}

// checkTop checks a top listing against the keys wanted, in order.
func checkTop(t *testing.T, c *cli, what string, got []peekJSON, want []topEntry, throttled bool) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s lists %d keys, want %d: %+v", what, len(got), len(want), got)
	}
	for i, w := range want {
		g := got[i]
		if g.Key != w.key || g.Policy != w.policy || g.Remaining != w.remaining || g.Throttled != throttled || g.Allowed == throttled {
			t.Errorf("%s[%d] = %+v, want %+v", what, i, g, w)
		}
		if want := redisKeyOf(t, c, w.policy, w.key); g.RedisKey != want {
			t.Errorf("%s[%d]: Redis key %q, want %q", what, i, g.RedisKey, want)
		}
		g.checkDurations(t)
	}
}

// TestThrottlectlTopEmpty: nothing under the prefix is an empty listing,
// not an error.
func TestThrottlectlTopEmpty(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	var got []peekJSON
	r := c.okJSON(&got, "top", "--all")
	if len(got) != 0 || strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("top --json on nothing: %q", r.stdout)
	}
	take(t, c.limiter(throttle.GCRA{Rate: throttle.PerHour(10), Burst: 5}), "tenant-1", 1)
	c.waitRegistered(1)
	r = c.ok("top")
	if !strings.HasPrefix(r.stdout, "no key throttled now under the prefix ") || !strings.Contains(r.stdout, "(1 limiter keys of 2 keys scanned)") {
		t.Errorf("top on nothing throttled: %q", r.stdout)
	}
}

// TestThrottlectlTopHashedKeys: caller keys stored by their hash are
// counted, not peeked.
func TestThrottlectlTopHashedKeys(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	hashed := c.tg.Prefix + "partner-api@gcra:{%#" + strings.Repeat("5e", 32) + "}"
	if err := c.tg.Client.Set(context.Background(), hashed, "1", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	r := c.run("--json", "top")
	if r.code != 0 || strings.TrimSpace(r.stdout) != "[]" || !strings.Contains(r.stderr, "1 keys under the prefix store their caller key by hash") {
		t.Errorf("top over a hashed key: %v", r)
	}
}

// TestThrottlectlTopPrefixIsNotAPattern: a prefix with glob characters
// matches only itself.
func TestThrottlectlTopPrefixIsNotAPattern(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	glob := c.tg.Prefix + "a*[b]?:"
	l, err := throttle.New(c.tg.Client, "l", throttle.GCRA{Rate: throttle.PerHour(1), Burst: 1}, throttle.WithPrefix(glob))
	if err != nil {
		t.Fatal(err)
	}
	take(t, l, "inside", 1)
	other, err := throttle.New(c.tg.Client, "other", throttle.GCRA{Rate: throttle.PerHour(1), Burst: 1}, throttle.WithPrefix(c.tg.Prefix+"aXbY:"))
	if err != nil {
		t.Fatal(err)
	}
	take(t, other, "outside", 1)
	for _, prefix := range []string{glob, c.tg.Prefix + "aXbY:"} {
		waitRegistered(t, c.tg.Client, prefix, 1)
	}
	var got []peekJSON
	c.okJSON(&got, "top", "--prefix", glob)
	if len(got) != 1 || got[0].Key != "inside" {
		t.Errorf("top --prefix %q: %+v", glob, got)
	}
}

// redisKeyOf returns the Redis key of caller's state under the test's
// limiter of policy (see pol).
func redisKeyOf(t *testing.T, c *cli, policy, caller string) string {
	t.Helper()
	if strings.HasPrefix(policy, "conc:") {
		p, err := parseConcurrency(policy)
		if err != nil {
			t.Fatal(err)
		}
		l, err := throttle.NewConcurrencyLimiter(c.tg.Client, pol(policy), p, throttle.WithPrefix(c.tg.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		return l.Key(caller)
	}
	p, err := throttle.ParsePolicy(policy)
	if err != nil {
		t.Fatal(err)
	}
	l, err := throttle.New(c.tg.Client, pol(policy), p, throttle.WithPrefix(c.tg.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	return l.Key(caller)
}

// TestTopShowsTasksWaiting: while a fleet's tasks wait in a waiting room
// (README's rules, both limiters named: a per-tenant limit of 10/s listed
// first, and an overall limit of 5/s shared fairly by tenant; three
// tenants' backlogs), top lists the overall key as throttled, under its
// limiter's name and rule, with the tasks waiting, by tenant, and when the
// last is expected to start; top --all lists the tenants' keys under the
// per-tenant limiter's name and rule; peek shows the same. (How close the
// expectation comes to what then happens is dashboard's
// TestKeyPageSaysWhoWaitsAndForHowLong.) Before, with named limiters, top
// said "no key throttled now" while 200 tasks waited.
func TestTopShowsTasksWaiting(t *testing.T) {
	c := newCLI(t)
	perTenant := c.namedLimiter("partner-tenant", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1})
	overall := c.namedLimiter("partner-overall", throttle.GCRA{Rate: throttle.PerSecond(5), Burst: 1})
	tenant := worker.ByPayloadField("tenant")
	th := asynqtest.NewThrottler(t, c.tg, []worker.Rule{
		worker.Rate("tenant", worker.Type("partner:sync"), perTenant, worker.KeyBy(tenant)),
		worker.Rate("overall", worker.Type("partner:sync"), overall, worker.KeyBy(worker.Constant("all")),
			worker.FairBy(tenant)),
	}, worker.WithInlineWait(0))
	var log asynqtest.RunLog
	f := asynqtest.NewFleet(t, c.tg, 1, 5, th, log.Handler(time.Millisecond))
	for _, tenant := range []string{"acme", "globex", "initech"} {
		for range 8 {
			f.Enqueue(t, "partner:sync", map[string]string{"tenant": tenant})
		}
	}
	var listed []peekJSON
	var got peekJSON
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		c.waitRegistered(2)
		c.okJSON(&listed, "top")
		i := slices.IndexFunc(listed, func(p peekJSON) bool { return p.Limiter == "partner-overall" })
		if i >= 0 && listed[i].Waiting >= 10 && len(listed[i].Flows) == 3 {
			got = listed[i]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("top never listed the overall key with 10 tasks of three tenants waiting: %+v", listed)
		}
	}
	for _, p := range listed {
		if p.Limiter != "partner-overall" && (p.Limiter != "partner-tenant" || !slices.Equal(p.Rules, []string{"tenant"})) {
			t.Errorf("top listed %+v; want only the overall key and the tenants' keys of partner-tenant, rule tenant", p)
		}
	}
	var all []peekJSON
	c.okJSON(&all, "top", "--all")
	tenants := 0
	for _, p := range all {
		if p.Limiter == "partner-tenant" && slices.Equal(p.Rules, []string{"tenant"}) && slices.Contains([]string{"acme", "globex", "initech"}, p.Key) {
			tenants++
		}
	}
	if tenants == 0 { // (a tenant's key exists once one of its tasks started)
		t.Errorf("top --all listed no tenant key of partner-tenant with its rule: %+v", all)
	}
	if table := c.ok("top").stdout; !strings.Contains(table, "RULES") || !regexp.MustCompile(`(?m)^all +partner-overall .* overall$`).MatchString(table) {
		t.Errorf("top's table does not show the overall key under its limiter and rule:\n%s", table)
	}
	sum := 0
	for _, fl := range got.Flows {
		sum += fl.Waiting
		if fl.First < 1 || fl.ExpectedWaitUS <= 0 || fl.ExpectedWaitUS > got.ExpectedWaitUS {
			t.Errorf("flow %+v of %+v", fl, got)
		}
	}
	if !got.Throttled || got.Limiter != "partner-overall" || got.Key != "all" || sum != got.Waiting || !slices.Equal(got.Rules, []string{"overall"}) ||
		got.ExpectedWaitUS < int64(got.Waiting-1)*200_000 {
		t.Errorf("top --json: %+v; want the key throttled, its tasks waiting by tenant, the last in at least (waiting-1) × 200ms", got)
	}
	r := c.ok("peek", "--name", "partner-overall", "all")
	if !strings.Contains(r.stdout, "tasks wait in the key's waiting room") || !strings.Contains(r.stdout, "FLOW") || !strings.Contains(r.stdout, "initech") ||
		!strings.Contains(r.stdout, "The worker's rules using partner-overall: overall.") {
		t.Errorf("peek of a key with tasks waiting:\n%s", r.stdout)
	}
}
