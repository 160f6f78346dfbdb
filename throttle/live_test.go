package throttle_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// lastPolicy records the policy of each decision of one goroutine.
type lastPolicy struct {
	mu     sync.Mutex
	policy string
}

func (p *lastPolicy) ObserveDecision(_ context.Context, d throttle.Decision) {
	p.mu.Lock()
	p.policy = d.Policy
	p.mu.Unlock()
}

func (p *lastPolicy) get() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.policy
}

// TestStoredPolicyAppliesWithinASecond: a policy stored for a limiter's
// name, and one stored for one caller key, are in force for every decision
// that starts a second after they were set (the promise; the limiter
// re-reads them at most PolicyFreshness apart), and unset, the policy in
// code is back as quickly. Decisions are made by one goroutine, so the
// order of "set returned" and "decision started" is the process's own.
func TestStoredPolicyAppliesWithinASecond(t *testing.T) {
	const promise = time.Second
	tg := redistest.New(t)
	ctx := context.Background()
	seen := &lastPolicy{}
	l := newNamedLimiter(t, tg, "partner-api", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 10}, throttle.WithLivePolicies(), throttle.WithObserver(seen))
	store, err := throttle.NewPolicyStore(tg.Client, tg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	const code, raised, vip = "gcra:10/1s:10", "gcra:20/1s:20", "gcra:50/1s:50"

	// decide makes decisions for key until the deadline and checks that
	// those starting after from carry want; it returns how long after from
	// the first carried it.
	decide := func(key string, from time.Time, want string, until time.Time) time.Duration {
		t.Helper()
		lag := time.Duration(-1)
		for time.Now().Before(until) {
			started := time.Now()
			if _, err := l.Allow(ctx, key); err != nil {
				t.Fatal(err)
			}
			got := seen.get()
			if got == want && lag < 0 {
				lag = started.Sub(from)
			}
			if started.Sub(from) >= promise && got != want {
				t.Fatalf("a decision for %q started %s after the change applied %s, want %s", key, started.Sub(from), got, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
		if lag < 0 {
			t.Fatalf("no decision for %q applied %s", key, want)
		}
		return lag
	}

	start := time.Now()
	decide("tenant-1", start.Add(-promise), code, start.Add(100*time.Millisecond))

	if err := store.Set(ctx, "partner-api", throttle.GCRA{Rate: throttle.PerSecond(20), Burst: 20}); err != nil {
		t.Fatal(err)
	}
	if err := store.Set(ctx, "partner-api", throttle.GCRA{Rate: throttle.PerSecond(50), Burst: 50}, "vip"); err != nil {
		t.Fatal(err)
	}
	set := time.Now()
	lag := decide("tenant-1", set, raised, set.Add(promise+300*time.Millisecond))
	decide("vip", set, vip, time.Now().Add(100*time.Millisecond))
	t.Logf("the stored policy applied %s after it was set", lag)
	if p, err := l.PolicyFor(ctx, "vip"); err != nil || p != (throttle.GCRA{Rate: throttle.PerSecond(50), Burst: 50}) {
		t.Errorf("PolicyFor(vip) = %v, %v", p, err)
	}

	if err := store.Unset(ctx, "partner-api"); err != nil {
		t.Fatal(err)
	}
	unset := time.Now()
	lag = decide("tenant-1", unset, code, unset.Add(promise+300*time.Millisecond))
	t.Logf("the policy in code applied %s after the stored one was unset", lag)
	decide("vip", unset, vip, time.Now().Add(50*time.Millisecond))

	got, err := store.Get(ctx, "partner-api")
	if err != nil {
		t.Fatal(err)
	}
	if got.Policy != nil || got.Keys["vip"] != (throttle.GCRA{Rate: throttle.PerSecond(50), Burst: 50}) || got.Kind != "gcra" || got.Version != 3 {
		t.Errorf("Get = %+v", got)
	}
}

// TestStoredPolicyRefusals: what cannot be applied is refused when set,
// and a stored policy a limiter cannot read (written around the store) is
// reported and not applied: the last good one stays in force.
// TestAFailedFirstReadOfStoredPoliciesIsNotTakenForNone: a live limiter
// whose first read of its stored policies fails (its caller gave up) reads
// them again at the next decision, rather than decide under the policy in
// code as though none were stored.
func TestAFailedFirstReadOfStoredPoliciesIsNotTakenForNone(t *testing.T) {
	tg := redistest.New(t)
	ctx := context.Background()
	store, err := throttle.NewPolicyStore(tg.Client, tg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Set(ctx, "partner-api", throttle.GCRA{Rate: throttle.PerSecond(1), Burst: 1}); err != nil {
		t.Fatal(err)
	}
	l := newNamedLimiter(t, tg, "partner-api", throttle.GCRA{Rate: throttle.PerSecond(100), Burst: 100}, throttle.WithLivePolicies())
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := l.Allow(gone, "k"); err == nil {
		t.Fatal("a decision with its context ended answered")
	}
	if r, err := l.Allow(ctx, "k"); err != nil || r.Limit != 1 {
		t.Fatalf("the next decision: %+v, %v; want it under the stored policy, a burst of 1", r, err)
	}
}

func TestStoredPolicyRefusals(t *testing.T) {
	tg := redistest.New(t)
	ctx := context.Background()
	var logged bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logged, nil))
	l := newNamedLimiter(t, tg, "partner-api", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 10}, throttle.WithLivePolicies(), throttle.WithLogger(logger))
	store, err := throttle.NewPolicyStore(tg.Client, tg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Allow(ctx, "tenant-1"); err != nil { // the limiter reads the store
		t.Fatal(err)
	}
	gcra20 := throttle.GCRA{Rate: throttle.PerSecond(20), Burst: 20}
	for _, tc := range []struct {
		name   string
		policy throttle.Policy
		keys   []string
		want   error
	}{
		{"", gcra20, nil, throttle.ErrInvalidKey},
		{"a{b}", gcra20, nil, throttle.ErrInvalidKey},
		{"partner-api", gcra20, []string{""}, throttle.ErrInvalidKey},
		{"partner-api", nil, nil, throttle.ErrInvalidPolicy},
		{"partner-api", throttle.GCRA{Rate: throttle.PerSecond(20)}, nil, throttle.ErrInvalidPolicy},
		{"partner-api", throttle.FixedWindow{Limit: 10, Window: time.Second}, nil, throttle.ErrInvalidPolicy}, // another algorithm
	} {
		if err := store.Set(ctx, tc.name, tc.policy, tc.keys...); !errors.Is(err, tc.want) {
			t.Errorf("Set(%q, %#v, %q) = %v, want %v", tc.name, tc.policy, tc.keys, err, tc.want)
		}
	}

	if err := store.Set(ctx, "partner-api", gcra20); err != nil {
		t.Fatal(err)
	}
	throttle.ForgetPolicyRead(l)
	if p, err := l.PolicyFor(ctx, "tenant-1"); err != nil || p != gcra20 {
		t.Fatalf("PolicyFor = %v, %v; want %v", p, err, gcra20)
	}
	// Written around the store: unreadable, then of another algorithm.
	hash := tg.Prefix + "policy:{partner-api}"
	for _, bad := range []string{"gcra:fast", "fw:10/1s"} {
		if err := tg.Client.HSet(ctx, hash, "*", bad).Err(); err != nil {
			t.Fatal(err)
		}
		tg.Client.HIncrBy(ctx, hash, "v", 1)
		throttle.ForgetPolicyRead(l)
		if p, err := l.PolicyFor(ctx, "tenant-1"); err != nil || p != gcra20 {
			t.Errorf("with %q stored: PolicyFor = %v, %v; want the last good, %v", bad, p, err, gcra20)
		}
		if !strings.Contains(logged.String(), bad) {
			t.Errorf("with %q stored, the log says nothing of it: %s", bad, logged.String())
		}
		got, err := store.Get(ctx, "partner-api")
		if err != nil || got.Invalid["*"] == "" || got.Policy != nil {
			t.Errorf("Get with %q stored = %+v, %v; want it listed as invalid", bad, got, err)
		}
	}
}

// TestPlansChooseThePolicyPerKey: one limiter, tenants on two plans (rates
// per minute, so that nothing refills while the test runs); a plan of
// another algorithm is refused, and a policy stored for a key takes
// precedence over its plan.
func TestPlansChooseThePolicyPerKey(t *testing.T) {
	tg := redistest.New(t)
	ctx := context.Background()
	pro := throttle.GCRA{Rate: throttle.PerMinute(50), Burst: 50}
	plan := func(_ context.Context, key string) throttle.Policy {
		switch {
		case strings.HasPrefix(key, "pro-"):
			return pro
		case strings.HasPrefix(key, "odd-"):
			return throttle.FixedWindow{Limit: 10, Window: time.Second}
		}
		return nil // the limiter's own: the free plan
	}
	l := newNamedLimiter(t, tg, "api", throttle.GCRA{Rate: throttle.PerMinute(5), Burst: 5}, throttle.WithLivePolicies(), throttle.WithPlan(plan))
	if got := drain(t, l, "free-1"); got != 5 {
		t.Errorf("free plan admitted %d at once, want 5", got)
	}
	if got := drain(t, l, "pro-1"); got != 50 {
		t.Errorf("pro plan admitted %d at once, want 50", got)
	}
	if r := allowN(t, l, "pro-2", 40); !r.Allowed || r.Limit != 50 {
		t.Errorf("40 units on the pro plan: %+v", r)
	}
	if _, err := l.AllowN(ctx, "free-2", 40); !errors.Is(err, throttle.ErrExceedsLimit) {
		t.Errorf("40 units on the free plan: %v, want ErrExceedsLimit", err)
	}
	if _, err := l.Allow(ctx, "odd-1"); !errors.Is(err, throttle.ErrInvalidPolicy) {
		t.Errorf("a plan of another algorithm: %v, want ErrInvalidPolicy", err)
	}
	store, err := throttle.NewPolicyStore(tg.Client, tg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Set(ctx, "api", throttle.GCRA{Rate: throttle.PerMinute(1), Burst: 1}, "pro-3"); err != nil {
		t.Fatal(err)
	}
	throttle.ForgetPolicyRead(l)
	if got := drain(t, l, "pro-3"); got != 1 {
		t.Errorf("pro-3 with a stored policy of burst 1 admitted %d, want 1", got)
	}
}

// TestStoredAlgorithmCanChange: the algorithm recorded for a name is not
// locked in. An operator's mistaken first Set (before any limiter ran) is
// mended with Replace; a fleet that moved the name from GCRA to
// FixedWindow gets its policy with Replace, which limiters of the new
// algorithm apply, while one of the old still running keeps the policy it
// had and says why.
func TestStoredAlgorithmCanChange(t *testing.T) {
	tg := redistest.New(t)
	ctx := context.Background()
	store, err := throttle.NewPolicyStore(tg.Client, tg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	var logged bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logged, nil))
	gcra20 := throttle.GCRA{Rate: throttle.PerSecond(20), Burst: 20}
	// An hour's window: draining it never crosses into the next window,
	// which would admit more (a one-second window did once in CI, 25).
	fw20 := throttle.FixedWindow{Limit: 20, Window: time.Hour}

	// A mistaken first set: FixedWindow, for a fleet of GCRA limiters.
	if err := store.Set(ctx, "partner-api", fw20); err != nil {
		t.Fatal(err)
	}
	old := newNamedLimiter(t, tg, "partner-api", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 10}, throttle.WithLivePolicies(), throttle.WithLogger(logger))
	if p, err := old.PolicyFor(ctx, "tenant-1"); err != nil || p != old.Policy() {
		t.Fatalf("GCRA limiter under a stored FixedWindow: PolicyFor = %v, %v; want its own", p, err)
	}
	if err := store.Set(ctx, "partner-api", gcra20); !errors.Is(err, throttle.ErrInvalidPolicy) || !strings.Contains(err.Error(), "Replace") {
		t.Fatalf("Set of GCRA on a name recorded as FixedWindow: %v; want ErrInvalidPolicy naming Replace", err)
	}
	if err := store.Replace(ctx, "partner-api", gcra20); err != nil {
		t.Fatal(err)
	}
	if err := store.Set(ctx, "partner-api", throttle.GCRA{Rate: throttle.PerSecond(50), Burst: 50}, "vip"); err != nil {
		t.Fatal(err)
	}
	throttle.ForgetPolicyRead(old) // as a second later
	if p, err := old.PolicyFor(ctx, "tenant-1"); err != nil || p != gcra20 {
		t.Fatalf("PolicyFor = %v, %v; want %v", p, err, gcra20)
	}

	// The fleet moves to FixedWindow: Set refuses, Replace does it.
	next := newNamedLimiter(t, tg, "partner-api", throttle.FixedWindow{Limit: 10, Window: time.Second}, throttle.WithLivePolicies())
	if err := store.Set(ctx, "partner-api", fw20); !errors.Is(err, throttle.ErrInvalidPolicy) {
		t.Fatalf("Set of FixedWindow on a GCRA name: %v; want ErrInvalidPolicy", err)
	}
	if err := store.Replace(ctx, "partner-api", fw20); err != nil {
		t.Fatal(err)
	}
	got, err := store.Get(ctx, "partner-api")
	if err != nil || got.Kind != "fw" || got.Policy != fw20 || len(got.Keys) != 0 || len(got.Invalid) != 0 {
		t.Fatalf("after Replace: %+v, %v; want only %v, of fw", got, err, fw20)
	}
	throttle.ForgetPolicyRead(next)
	if p, err := next.PolicyFor(ctx, "tenant-1"); err != nil || p != fw20 {
		t.Fatalf("FixedWindow limiter after Replace: PolicyFor = %v, %v; want %v", p, err, fw20)
	}
	if admitted := drain(t, next, "tenant-1"); admitted != 20 {
		t.Fatalf("the FixedWindow limiter admitted %d at once, want 20 (fresh state)", admitted)
	}
	throttle.ForgetPolicyRead(old)
	if p, err := old.PolicyFor(ctx, "tenant-1"); err != nil || p != gcra20 {
		t.Fatalf("GCRA limiter still running after Replace: PolicyFor = %v, %v; want the policy it had, %v", p, err, gcra20)
	}
	if !strings.Contains(logged.String(), "fw:20/1h") {
		t.Fatalf("the GCRA limiter did not log the policy it cannot apply: %s", logged.String())
	}
	if err := store.Replace(ctx, "a{b}", fw20); !errors.Is(err, throttle.ErrInvalidKey) {
		t.Fatalf("Replace with a bad name: %v", err)
	}
	if err := store.Replace(ctx, "partner-api", throttle.FixedWindow{Limit: 0, Window: time.Second}); !errors.Is(err, throttle.ErrInvalidPolicy) {
		t.Fatalf("Replace with a bad policy: %v", err)
	}
}
