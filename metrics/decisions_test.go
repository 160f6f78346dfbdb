package metrics_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// TestKnownDecisionsExactCounts runs a known sequence of real decisions on
// real limiters (embedded Redis, or REDIS_ADDR / REDIS_CLUSTER_ADDRS) and
// scrapes exact counts.
func TestKnownDecisionsExactCounts(t *testing.T) {
	tg := redistest.New(t)
	ctx := context.Background()
	c, reg := newCollector(t)

	// Burst 2 on a rate so slow that nothing refills during the test.
	partner := newNamedLimiter(t, tg.Client, tg, "partner", throttle.GCRA{Rate: throttle.PerHour(1), Burst: 2}, throttle.WithObserver(c))
	for i, want := range []bool{true, true, false} {
		r, err := partner.Allow(ctx, "tenant-1")
		if err != nil || r.Allowed != want {
			t.Fatalf("Allow %d: %+v, %v; want allowed=%v", i+1, r, err, want)
		}
	}
	if r, err := partner.Peek(ctx, "tenant-1"); err != nil || r.Allowed {
		t.Fatalf("Peek: %+v, %v; want throttled", r, err)
	}
	if _, err := partner.Allow(ctx, ""); !errors.Is(err, throttle.ErrInvalidKey) {
		t.Fatalf("empty key: %v, want ErrInvalidKey", err)
	}
	if res, err := partner.Reserve(ctx, "tenant-2", 1, time.Hour); err != nil || !res.OK {
		t.Fatalf("Reserve: %+v, %v", res, err)
	}

	// A deny cache answers the third request without Redis.
	cached := newNamedLimiter(t, tg.Client, tg, "cached", throttle.GCRA{Rate: throttle.PerHour(1), Burst: 1}, throttle.WithDenyCache(16), throttle.WithObserver(c))
	for i, want := range []struct{ allowed, cached bool }{{true, false}, {false, false}, {false, true}} {
		r, err := cached.Allow(ctx, "tenant-1")
		if err != nil || r.Allowed != want.allowed || r.Cached != want.cached {
			t.Fatalf("cached Allow %d: %+v, %v; want allowed=%v cached=%v", i+1, r, err, want.allowed, want.cached)
		}
	}

	exports := newNamedConcurrency(t, tg.Client, tg.Prefix, "exports", throttle.Concurrency{Limit: 1, Lease: time.Minute}, throttle.WithObserver(c))
	lease, _, err := exports.Acquire(ctx, "tenant-1")
	if err != nil || lease == nil {
		t.Fatalf("Acquire: %v, %v", lease, err)
	}
	defer lease.Release(ctx)
	if l, r, err := exports.Acquire(ctx, "tenant-1"); err != nil || l != nil || r.Allowed {
		t.Fatalf("second Acquire: %v, %+v, %v; want throttled", l, r, err)
	}

	compare(t, c, `
# HELP jobthrottle_decisions_total Decisions of jobthrottle limiters by limiter name, call (allow, peek, reserve, acquire; share: a renewal of a leased share, admitted when one was granted) and outcome (admitted, throttled, error, degraded).
# TYPE jobthrottle_decisions_total counter
jobthrottle_decisions_total{limiter="cached",op="allow",outcome="admitted"} 1
jobthrottle_decisions_total{limiter="cached",op="allow",outcome="throttled"} 2
jobthrottle_decisions_total{limiter="exports",op="acquire",outcome="admitted"} 1
jobthrottle_decisions_total{limiter="exports",op="acquire",outcome="throttled"} 1
jobthrottle_decisions_total{limiter="partner",op="allow",outcome="admitted"} 2
jobthrottle_decisions_total{limiter="partner",op="allow",outcome="error"} 1
jobthrottle_decisions_total{limiter="partner",op="allow",outcome="throttled"} 1
jobthrottle_decisions_total{limiter="partner",op="peek",outcome="throttled"} 1
jobthrottle_decisions_total{limiter="partner",op="reserve",outcome="admitted"} 1
# HELP jobthrottle_redis_errors_total Decisions Redis could not make (unreachable, too slow or answering with an error), failed closed or let through degraded, by limiter name.
# TYPE jobthrottle_redis_errors_total counter
jobthrottle_redis_errors_total{limiter="cached"} 0
jobthrottle_redis_errors_total{limiter="exports"} 0
jobthrottle_redis_errors_total{limiter="partner"} 0
# HELP jobthrottle_deny_cache_hits_total Rejections answered from the limiter's in-process deny cache without asking Redis, by limiter name.
# TYPE jobthrottle_deny_cache_hits_total counter
jobthrottle_deny_cache_hits_total{limiter="cached"} 1
jobthrottle_deny_cache_hits_total{limiter="exports"} 0
jobthrottle_deny_cache_hits_total{limiter="partner"} 0
# HELP jobthrottle_policy_decisions_total Decisions of jobthrottle rate limiters by limiter name and the policy in force that made them (the limiter's own, a plan, or one stored with throttlectl set), in its short form: a policy change shows as a new series, a rollout as two.
# TYPE jobthrottle_policy_decisions_total counter
jobthrottle_policy_decisions_total{limiter="cached",policy="gcra:1/1h:1"} 3
jobthrottle_policy_decisions_total{limiter="partner",policy="gcra:1/1h:2"} 5
`, "jobthrottle_decisions_total", "jobthrottle_redis_errors_total", "jobthrottle_deny_cache_hits_total", "jobthrottle_policy_decisions_total")

	// One latency sample per decision; the times themselves vary.
	got := samples(t, reg)
	checkSamples(t, withPrefix(got, "jobthrottle_decision_duration_seconds_count"), map[string]float64{
		`jobthrottle_decision_duration_seconds_count{limiter="partner",op="allow"}`:   4,
		`jobthrottle_decision_duration_seconds_count{limiter="partner",op="peek"}`:    1,
		`jobthrottle_decision_duration_seconds_count{limiter="partner",op="reserve"}`: 1,
		`jobthrottle_decision_duration_seconds_count{limiter="cached",op="allow"}`:    3,
		`jobthrottle_decision_duration_seconds_count{limiter="exports",op="acquire"}`: 2,
	})
	for k, v := range withPrefix(got, "jobthrottle_decision_duration_seconds_sum") {
		if v <= 0 || v > 10 {
			t.Errorf("%s = %v, want a positive time under 10s", k, v)
		}
	}
	// Nothing from the worker yet.
	if n := len(withPrefix(got, "jobthrottle_worker_")); n != 0 {
		t.Errorf("%d worker series before any worker event", n)
	}
}

// TestRedisDownExactCounts: against an address where nothing listens, a
// fail-closed limiter's decisions count as errors and a fail-open one's as
// degraded; both count as Redis errors, and bad input does not.
func TestRedisDownExactCounts(t *testing.T) {
	for _, tc := range []struct {
		policy    throttle.FailurePolicy
		decisions string // the expected decisions_total samples
	}{
		{throttle.FailClosed, `
jobthrottle_decisions_total{limiter="exports",op="acquire",outcome="error"} 2
jobthrottle_decisions_total{limiter="partner",op="allow",outcome="error"} 4
jobthrottle_decisions_total{limiter="partner",op="peek",outcome="error"} 1
jobthrottle_decisions_total{limiter="partner",op="reserve",outcome="error"} 1
`},
		// Peek ignores the failure policy; the empty key is an error.
		{throttle.FailOpen, `
jobthrottle_decisions_total{limiter="exports",op="acquire",outcome="degraded"} 2
jobthrottle_decisions_total{limiter="partner",op="allow",outcome="degraded"} 3
jobthrottle_decisions_total{limiter="partner",op="allow",outcome="error"} 1
jobthrottle_decisions_total{limiter="partner",op="peek",outcome="error"} 1
jobthrottle_decisions_total{limiter="partner",op="reserve",outcome="degraded"} 1
`},
	} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			ctx := context.Background()
			down := deadClient(t)
			c, _ := newCollector(t)
			opts := []throttle.Option{throttle.WithFailurePolicy(tc.policy), throttle.WithObserver(c), throttle.WithLogger(nil)}
			partner, err := throttle.New(down, "partner", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 2}, opts...)
			if err != nil {
				t.Fatal(err)
			}
			for range 3 {
				_, _ = partner.Allow(ctx, "tenant-1")
			}
			_, _ = partner.Reserve(ctx, "tenant-1", 1, 0)
			if _, err := partner.Peek(ctx, "tenant-1"); !errors.Is(err, throttle.ErrUnavailable) {
				t.Fatalf("Peek: %v, want ErrUnavailable under either policy", err)
			}
			if _, err := partner.Allow(ctx, ""); !errors.Is(err, throttle.ErrInvalidKey) {
				t.Fatalf("empty key: %v", err) // an error, but not Redis's
			}
			exports, err := throttle.NewConcurrencyLimiter(down, "exports", throttle.Concurrency{Limit: 1, Lease: time.Second}, opts...)
			if err != nil {
				t.Fatal(err)
			}
			for range 2 {
				if lease, _, err := exports.Acquire(ctx, "tenant-1"); lease != nil {
					_ = lease.Release(ctx)
				} else if !errors.Is(err, throttle.ErrUnavailable) {
					t.Fatalf("Acquire: %v", err)
				}
			}

			// Redis errors: 3 allows, the reserve and the peek; not the
			// empty key.
			compare(t, c, `
# HELP jobthrottle_decisions_total Decisions of jobthrottle limiters by limiter name, call (allow, peek, reserve, acquire; share: a renewal of a leased share, admitted when one was granted) and outcome (admitted, throttled, error, degraded).
# TYPE jobthrottle_decisions_total counter`+tc.decisions+`# HELP jobthrottle_redis_errors_total Decisions Redis could not make (unreachable, too slow or answering with an error), failed closed or let through degraded, by limiter name.
# TYPE jobthrottle_redis_errors_total counter
jobthrottle_redis_errors_total{limiter="exports"} 2
jobthrottle_redis_errors_total{limiter="partner"} 5
`, "jobthrottle_decisions_total", "jobthrottle_redis_errors_total")
		})
	}
}

// TestConcurrentObservers: decisions observed from many goroutines at
// once all count (run with -race).
func TestConcurrentObservers(t *testing.T) {
	c, _ := newCollector(t)
	const goroutines, each = 16, 500
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				outcome := throttle.Admitted
				if i%2 == 1 {
					outcome = throttle.Throttled
				}
				c.ObserveDecision(context.Background(), throttle.Decision{Limiter: "shared", Op: throttle.OpAllow, Key: string(rune('a' + g)), N: 1,
					Outcome: outcome, Latency: time.Millisecond, Cached: outcome == throttle.Throttled})
			}
		}()
	}
	wg.Wait()
	compare(t, c, `
# HELP jobthrottle_decisions_total Decisions of jobthrottle limiters by limiter name, call (allow, peek, reserve, acquire; share: a renewal of a leased share, admitted when one was granted) and outcome (admitted, throttled, error, degraded).
# TYPE jobthrottle_decisions_total counter
jobthrottle_decisions_total{limiter="shared",op="allow",outcome="admitted"} 4000
jobthrottle_decisions_total{limiter="shared",op="allow",outcome="throttled"} 4000
# HELP jobthrottle_deny_cache_hits_total Rejections answered from the limiter's in-process deny cache without asking Redis, by limiter name.
# TYPE jobthrottle_deny_cache_hits_total counter
jobthrottle_deny_cache_hits_total{limiter="shared"} 4000
`, "jobthrottle_decisions_total", "jobthrottle_deny_cache_hits_total")
}

// TestWaitsAreNotDecisions: a Wait that sleeps for its slot is one
// decision (its reservation) in the series, not two; its sleep, which
// observers see as an OpWait, is left out.
func TestWaitsAreNotDecisions(t *testing.T) {
	tg := redistest.New(t)
	ctx := context.Background()
	c, reg := newCollector(t)
	paced := newNamedLimiter(t, tg.Client, tg, "paced", throttle.GCRA{Rate: throttle.PerSecond(20), Burst: 1}, throttle.WithObserver(c))
	for range 2 {
		if err := paced.Wait(ctx, "k"); err != nil {
			t.Fatal(err)
		}
	}
	got := withPrefix(samples(t, reg), "jobthrottle_decision")
	// The count tells a sleep counted as a decision; the sum is the
	// reservations' round trips, whatever the machine makes of them.
	delete(got, `jobthrottle_decision_duration_seconds_sum{limiter="paced",op="reserve"}`)
	checkSamples(t, got, map[string]float64{
		`jobthrottle_decisions_total{limiter="paced",op="reserve",outcome="admitted"}`: 2,
		`jobthrottle_decision_duration_seconds_count{limiter="paced",op="reserve"}`:    2,
	})
}
