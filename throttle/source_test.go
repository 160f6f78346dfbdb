package throttle_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/observetest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// sourceOp is one kind of call whose decision names the policy in force.
type sourceOp struct {
	name string
	op   throttle.Op
	// call makes the call for key and returns the capacity of the policy
	// that decided, as the call reports it.
	call func(ctx context.Context, l *throttle.Limiter, key string) (int, error)
}

var sourceOps = []sourceOp{
	{"Allow", throttle.OpAllow, func(ctx context.Context, l *throttle.Limiter, key string) (int, error) {
		r, err := l.Allow(ctx, key)
		return r.Limit, err
	}},
	{"Peek", throttle.OpPeek, func(ctx context.Context, l *throttle.Limiter, key string) (int, error) {
		r, err := l.Peek(ctx, key)
		return r.Limit, err
	}},
	{"Reserve", throttle.OpReserve, func(ctx context.Context, l *throttle.Limiter, key string) (int, error) {
		r, err := l.Reserve(ctx, key, 1, time.Hour)
		if err != nil {
			return 0, err
		}
		return r.Limit, nil
	}},
	{"AllowMany", throttle.OpAllow, func(ctx context.Context, l *throttle.Limiter, key string) (int, error) {
		rs, err := l.AllowMany(ctx, []throttle.Request{{Key: key, N: 1}})
		if err != nil {
			return 0, err
		}
		return rs[0].Limit, nil
	}},
}

// capacityOf returns the burst of a meter policy.
func capacityOf(t testing.TB, p throttle.Policy) int {
	t.Helper()
	g, ok := p.(throttle.GCRA)
	if !ok {
		t.Fatalf("capacityOf(%#v): not a GCRA", p)
	}
	return g.Burst
}

// lastDecision returns the last decision rec saw.
func lastDecision(t testing.TB, rec *recorder) throttle.Decision {
	t.Helper()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.decisions) == 0 {
		t.Fatal("no decision observed")
	}
	return rec.decisions[len(rec.decisions)-1]
}

// checkSource makes every kind of call for key and checks that each
// decision carries want as its Policy and source as its PolicySource, that
// want decided (its capacity is the one reported), and that PolicyFor
// agrees.
func checkSource(t testing.TB, l *throttle.Limiter, rec *recorder, key string, want throttle.Policy, source throttle.PolicySource) {
	t.Helper()
	ctx := context.Background()
	for _, op := range sourceOps {
		limit, err := op.call(ctx, l, key)
		if err != nil {
			t.Fatalf("%s(%q): %v", op.name, key, err)
		}
		d := lastDecision(t, rec)
		if d.Op != op.op || d.Key != key || d.Limiter != l.Name() || d.Outcome == throttle.Errored {
			t.Errorf("%s(%q) observed as %+v", op.name, key, d)
		}
		if d.Policy != want.String() || d.PolicySource != source {
			t.Errorf("%s(%q): decision's policy %q from %q, want %q from %q", op.name, key, d.Policy, d.PolicySource, want.String(), source)
		}
		if c := capacityOf(t, want); limit != c {
			t.Errorf("%s(%q): the call reports a limit of %d, want %d of %s", op.name, key, limit, c, want)
		}
	}
	if p, err := l.PolicyFor(ctx, key); err != nil || p != want {
		t.Errorf("PolicyFor(%q) = %v, %v; want %s", key, p, err, want)
	}
}

// TestDecisionsSayWhereThePolicyCameFrom: a named limiter with a plan for
// "pro", a policy stored for the limiter and one stored for "vip", set and
// unset in turn: every decision names the policy in force for its key and
// where it came from, in the order stored for the key, stored for the
// limiter, plan, code. Rates are per minute so that nothing refills while
// the test runs.
func TestDecisionsSayWhereThePolicyCameFrom(t *testing.T) {
	tg := redistest.New(t)
	ctx := context.Background()
	var (
		code         = throttle.GCRA{Rate: throttle.PerMinute(5), Burst: 5}
		plan         = throttle.GCRA{Rate: throttle.PerMinute(50), Burst: 50}
		stored       = throttle.GCRA{Rate: throttle.PerMinute(20), Burst: 20}
		storedForKey = throttle.GCRA{Rate: throttle.PerMinute(100), Burst: 100}
	)
	rec := &recorder{}
	l := newNamedLimiter(t, tg, "partner-api", code, throttle.WithLivePolicies(), throttle.WithObserver(rec),
		throttle.WithPlan(func(_ context.Context, key string) throttle.Policy {
			switch key {
			case "pro":
				return plan
			case "same":
				return code // the plan chose the policy in code
			}
			return nil
		}))
	if l.Name() != "partner-api" {
		t.Fatalf("Name() = %q, want partner-api", l.Name())
	}
	store, err := throttle.NewPolicyStore(tg.Client, tg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		key    string
		policy throttle.Policy
		source throttle.PolicySource
	}
	for _, step := range []struct {
		name   string
		change func() error // nil: nothing changes
		want   []want
	}{
		{"nothing stored", nil, []want{
			{"free", code, throttle.SourceCode},
			{"same", code, throttle.SourceCode},
			{"pro", plan, throttle.SourcePlan},
			{"vip", code, throttle.SourceCode},
		}},
		{"stored for the limiter", func() error { return store.Set(ctx, "partner-api", stored) }, []want{
			{"free", stored, throttle.SourceStored},
			{"pro", stored, throttle.SourceStored},
			{"vip", stored, throttle.SourceStored},
		}},
		{"stored for vip", func() error { return store.Set(ctx, "partner-api", storedForKey, "vip") }, []want{
			{"vip", storedForKey, throttle.SourceStoredForKey},
			{"free", stored, throttle.SourceStored},
			{"pro", stored, throttle.SourceStored},
		}},
		{"unset for the limiter", func() error { return store.Unset(ctx, "partner-api") }, []want{
			{"vip", storedForKey, throttle.SourceStoredForKey},
			{"free", code, throttle.SourceCode},
			{"pro", plan, throttle.SourcePlan},
		}},
		{"unset for vip", func() error { return store.Unset(ctx, "partner-api", "vip") }, []want{
			{"vip", code, throttle.SourceCode},
			{"pro", plan, throttle.SourcePlan},
		}},
	} {
		t.Run(step.name, func(t *testing.T) {
			if step.change != nil {
				if err := step.change(); err != nil {
					t.Fatal(err)
				}
				// Read the store now, as a decision does once PolicyFreshness
				// has passed since the last read.
				throttle.ForgetPolicyRead(l)
			}
			for _, w := range step.want {
				checkSource(t, l, rec, w.key, w.policy, w.source)
			}
		})
	}
}

// TestPolicySourceWithoutNameOrPolicy: an unnamed limiter's decisions come
// from the code, under its policy's name; a decision no policy made (bad
// input) and a ConcurrencyLimiter's carry no policy and no source.
func TestPolicySourceWithoutNameOrPolicy(t *testing.T) {
	tg := redistest.New(t)
	ctx := context.Background()
	rec := &recorder{}
	p := throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 5}
	l := newLimiter(t, tg, p, throttle.WithObserver(rec))
	checkSource(t, l, rec, "k", p, throttle.SourceCode)
	if d := lastDecision(t, rec); d.Limiter != p.String() {
		t.Errorf("an unnamed limiter's decisions carry %q, want %q", d.Limiter, p.String())
	}

	if _, err := l.Allow(ctx, ""); err == nil {
		t.Fatal("Allow with an empty key: no error")
	}
	if d := lastDecision(t, rec); d.Outcome != throttle.Errored || d.Policy != "" || d.PolicySource != "" {
		t.Errorf("bad input observed as %+v, want an error without policy or source", d)
	}

	conc, err := throttle.NewConcurrencyLimiter(tg.Client, "pool", throttle.Concurrency{Limit: 1, Lease: time.Minute},
		throttle.WithPrefix(tg.Prefix), throttle.WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	lease, _, err := conc.Acquire(ctx, "x")
	if err != nil || lease == nil {
		t.Fatalf("Acquire: %v", err)
	}
	defer lease.Release(ctx)
	if d := lastDecision(t, rec); d.Op != throttle.OpAcquire || d.Limiter != "pool" || d.Policy != "conc:1/1m0s" || d.PolicySource != throttle.SourceCode {
		t.Errorf("Acquire observed as %+v, want limiter pool with its policy conc:1/1m0s from code", d)
	}
}

// TestLimiterName: a limiter's name is the one given to its constructor;
// its decisions carry the same, and the policy's short form.
func TestLimiterName(t *testing.T) {
	tg := redistest.New(t)
	ctx := context.Background()
	for _, tc := range []struct {
		policy throttle.Policy
		name   string
	}{
		{throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 5}, "partner-api"},
		{throttle.TokenBucket{Rate: throttle.PerSecond(3), Burst: 2}, "tb:3/1s:2"},
		{throttle.SlidingWindow{Limit: 25, Window: time.Second}, "sw-named"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{}
			l := newNamedLimiter(t, tg, tc.name, tc.policy, throttle.WithObserver(rec))
			if got := l.Name(); got != tc.name {
				t.Errorf("Name() = %q, want %q", got, tc.name)
			}
			if _, err := l.Allow(ctx, "k"); err != nil {
				t.Fatal(err)
			}
			if d := lastDecision(t, rec); d.Limiter != tc.name || d.Policy != fmt.Sprint(tc.policy) {
				t.Errorf("decision's limiter %q, policy %q; want %q, %q", d.Limiter, d.Policy, tc.name, tc.policy)
			}
		})
	}
	rec := &recorder{}
	c, err := throttle.NewConcurrencyLimiter(tg.Client, "pool", throttle.Concurrency{Limit: 3, Lease: 30 * time.Second},
		throttle.WithPrefix(tg.Prefix), throttle.WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Name(); got != "pool" {
		t.Errorf("Name() = %q, want %q", got, "pool")
	}
	lease, _, err := c.Acquire(ctx, "k")
	if err != nil || lease == nil {
		t.Fatalf("Acquire: %v", err)
	}
	defer lease.Release(ctx)
	if d := lastDecision(t, rec); d.Limiter != "pool" || d.Policy != "conc:3/30s" {
		t.Errorf("decision's limiter %q, policy %q; want pool, conc:3/30s", d.Limiter, d.Policy)
	}
}

// orderObserver returns the i-th observer of log: it logs "op key outcome" and keeps
// what it saw.
func orderObserver(log *observetest.Log[throttle.Decision], i int) throttle.Observer {
	return throttle.ObserverFunc(func(_ context.Context, d throttle.Decision) {
		log.Record(i, fmt.Sprintf("%s %s %s", d.Op, d.Key, d.Outcome), d)
	})
}

// TestObserversGivenMoreThanOnce: WithObserver given once, twice or
// three times: every observer receives every decision, of a Limiter and of
// a ConcurrencyLimiter, in the order the observers were given.
func TestObserversGivenMoreThanOnce(t *testing.T) {
	tg := redistest.New(t)
	ctx := context.Background()
	for _, n := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("%d observers", n), func(t *testing.T) {
			log := &observetest.Log[throttle.Decision]{}
			var opts []throttle.Option
			for range n {
				opts = append(opts, throttle.WithObserver(orderObserver(log, log.Add())))
			}
			l := newNamedLimiter(t, tg, fmt.Sprintf("limiter-%d", n), throttle.GCRA{Rate: throttle.PerHour(1), Burst: 1}, opts...)
			allowN(t, l, "a", 1)
			allowN(t, l, "a", 1)
			peek(t, l, "b")
			conc, err := throttle.NewConcurrencyLimiter(tg.Client, fmt.Sprintf("pool-%d", n), throttle.Concurrency{Limit: 1, Lease: time.Minute},
				append([]throttle.Option{throttle.WithPrefix(tg.Prefix)}, opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			lease, _, err := conc.Acquire(ctx, "c")
			if err != nil || lease == nil {
				t.Fatalf("Acquire: %v", err)
			}
			defer lease.Release(ctx)
			if _, _, err := conc.Acquire(ctx, "c"); err != nil {
				t.Fatal(err)
			}
			log.CheckOrder(t, n, []string{
				"allow a admitted", "allow a throttled", "peek b admitted",
				"acquire c admitted", "acquire c throttled",
			})
		})
	}
}
