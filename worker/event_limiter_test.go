package worker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/observetest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
)

// rateLimiter returns a Limiter of p on the target, under its prefix.
func rateLimiter(t testing.TB, tg *redistest.Target, p throttle.Policy, opts ...throttle.Option) *throttle.Limiter {
	t.Helper()
	return namedRateLimiter(t, tg, fmt.Sprint(p), p, opts...)
}

// namedRateLimiter is rateLimiter of the limiter called name.
func namedRateLimiter(t testing.TB, tg *redistest.Target, name string, p throttle.Policy, opts ...throttle.Option) *throttle.Limiter {
	t.Helper()
	l, err := throttle.New(tg.Client, name, p, append([]throttle.Option{throttle.WithPrefix(tg.Prefix)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// concLimiter returns a ConcurrencyLimiter of p on the target, under its
// prefix.
func concLimiter(t testing.TB, tg *redistest.Target, p throttle.Concurrency, opts ...throttle.Option) *throttle.ConcurrencyLimiter {
	t.Helper()
	return namedConcLimiter(t, tg, fmt.Sprintf("conc-%d", p.Limit), p, opts...)
}

// namedConcLimiter is concLimiter of the limiter called name.
func namedConcLimiter(t testing.TB, tg *redistest.Target, name string, p throttle.Concurrency, opts ...throttle.Option) *throttle.ConcurrencyLimiter {
	t.Helper()
	c, err := throttle.NewConcurrencyLimiter(tg.Client, name, p, append([]throttle.Option{throttle.WithPrefix(tg.Prefix)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// runTasks configures th as an asynq server would (so that a task waits
// inline no longer than its lane's lead allows: a fraction of a second, not
// the seconds of an unconfigured Throttler), then runs n tasks of type
// "job" through th's middleware, one after the other, and returns the
// errors the middleware returned.
func runTasks(t testing.TB, th *worker.Throttler, n int) []error {
	t.Helper()
	th.Configure(&asynq.Config{})
	h := th.Middleware(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil }))
	errs := make([]error, n)
	for i := range errs {
		errs[i] = h.ProcessTask(context.Background(), asynq.NewTask("job", nil))
	}
	return errs
}

// TestEventsNameTheRulesLimiter: every event with a rule names that rule's
// limiter (its Name), whether the
// task was sent back, waited inline or took a concurrency lease; events
// without a rule name none.
func TestEventsNameTheRulesLimiter(t *testing.T) {
	for _, tc := range []struct {
		name string
		// setup returns the rules, the name of each rule's limiter, and
		// the Throttler's options.
		setup func(t *testing.T, tg *redistest.Target) ([]worker.Rule, map[string]string, []worker.Option)
		tasks int
		want  []string // "kind rule" of events that must be among those seen
	}{
		{"rescheduled by a named rate limiter", func(t *testing.T, tg *redistest.Target) ([]worker.Rule, map[string]string, []worker.Option) {
			l := namedRateLimiter(t, tg, "partner-api", throttle.FixedWindow{Limit: 1, Window: redistest.FarWindow})
			return []worker.Rule{worker.Rate("hourly", worker.AnyTask(), l, worker.KeyBy(worker.ByType()))}, map[string]string{"hourly": l.Name()}, nil
		}, 2, []string{"admitted ", "rescheduled hourly"}},
		{"rescheduled by an unnamed rate limiter", func(t *testing.T, tg *redistest.Target) ([]worker.Rule, map[string]string, []worker.Option) {
			l := rateLimiter(t, tg, throttle.FixedWindow{Limit: 1, Window: redistest.FarWindow})
			return []worker.Rule{worker.Rate("hourly", worker.AnyTask(), l, worker.KeyBy(worker.ByType()))}, map[string]string{"hourly": l.Name()}, nil
		}, 2, []string{"admitted ", "rescheduled hourly"}},
		{"waited inline for a meter", func(t *testing.T, tg *redistest.Target) ([]worker.Rule, map[string]string, []worker.Option) {
			l := namedRateLimiter(t, tg, "meter", throttle.GCRA{Rate: throttle.PerSecond(4), Burst: 1})
			return []worker.Rule{worker.Rate("paced", worker.AnyTask(), l, worker.KeyBy(worker.ByType()))}, map[string]string{"paced": l.Name()},
				[]worker.Option{worker.WithInlineWait(time.Second)}
		}, 2, []string{"admitted ", "waited_inline paced"}},
		{"lease of a named concurrency cap", func(t *testing.T, tg *redistest.Target) ([]worker.Rule, map[string]string, []worker.Option) {
			c := namedConcLimiter(t, tg, "pool", throttle.Concurrency{Limit: 1, Lease: time.Minute})
			return []worker.Rule{worker.Concurrency("capped", worker.AnyTask(), c, worker.KeyBy(worker.ByType()))}, map[string]string{"capped": c.Name()}, nil
		}, 1, []string{"lease_taken capped", "lease_released capped"}},
		{"lease of an unnamed concurrency cap", func(t *testing.T, tg *redistest.Target) ([]worker.Rule, map[string]string, []worker.Option) {
			c := concLimiter(t, tg, throttle.Concurrency{Limit: 1, Lease: time.Minute})
			return []worker.Rule{worker.Concurrency("capped", worker.AnyTask(), c, worker.KeyBy(worker.ByType()))}, map[string]string{"capped": c.Name()}, nil
		}, 1, []string{"lease_taken capped", "lease_released capped"}},
		{"rescheduled by a full concurrency cap", func(t *testing.T, tg *redistest.Target) ([]worker.Rule, map[string]string, []worker.Option) {
			c := namedConcLimiter(t, tg, "pool", throttle.Concurrency{Limit: 1, Lease: time.Minute})
			lease, _, err := c.Acquire(context.Background(), "job") // the slot the task's key needs
			if err != nil || lease == nil {
				t.Fatalf("Acquire: %v", err)
			}
			t.Cleanup(func() { _ = lease.Release(context.Background()) })
			return []worker.Rule{worker.Concurrency("capped", worker.AnyTask(), c, worker.KeyBy(worker.ByType()))}, map[string]string{"capped": c.Name()},
				[]worker.Option{worker.WithInlineWait(0)}
		}, 1, []string{"rescheduled capped"}},
		{"a rate rule and a concurrency rule", func(t *testing.T, tg *redistest.Target) ([]worker.Rule, map[string]string, []worker.Option) {
			l := namedRateLimiter(t, tg, "partner-api", throttle.FixedWindow{Limit: 1, Window: redistest.FarWindow})
			c := namedConcLimiter(t, tg, "pool", throttle.Concurrency{Limit: 2, Lease: time.Minute})
			return []worker.Rule{
					worker.Rate("hourly", worker.AnyTask(), l, worker.KeyBy(worker.ByType())),
					worker.Concurrency("capped", worker.AnyTask(), c, worker.KeyBy(worker.ByType())),
				}, map[string]string{"hourly": l.Name(), "capped": c.Name()},
				nil
		}, 2, []string{"admitted ", "lease_taken capped", "lease_released capped", "rescheduled hourly"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tg := redistest.New(t)
			rules, limiters, opts := tc.setup(t, tg)
			var events asynqtest.Events
			th := asynqtest.NewThrottler(t, tg, rules, append(opts, worker.WithObserver(&events))...)
			runTasks(t, th, tc.tasks)
			seen := map[string]bool{}
			for _, e := range events.All() {
				seen[fmt.Sprintf("%s %s", e.Kind, e.Rule)] = true
			}
			for _, w := range tc.want {
				if !seen[w] {
					t.Errorf("no %q event among %v", w, seen)
				}
			}
			for _, e := range events.All() {
				want, ok := limiters[e.Rule]
				if e.Rule != "" && !ok {
					t.Errorf("%s event of an unknown rule %q", e.Kind, e.Rule)
				}
				if e.Limiter != want {
					t.Errorf("%s event of rule %q names limiter %q, want %q", e.Kind, e.Rule, e.Limiter, want)
				}
			}
		})
	}
}

// eventObserver returns the i-th observer of log: it logs "kind rule" and keeps
// what it saw.
func eventObserver(log *observetest.Log[worker.Event], i int) worker.Observer {
	return worker.ObserverFunc(func(_ context.Context, e worker.Event) {
		log.Record(i, fmt.Sprintf("%s %s", e.Kind, e.Rule), e)
	})
}

// TestWorkerObserversGivenMoreThanOnce: worker.WithObserver given once,
// twice or three times: every observer receives every event, in the order
// the observers were given.
func TestWorkerObserversGivenMoreThanOnce(t *testing.T) {
	for _, n := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("%d observers", n), func(t *testing.T) {
			tg := redistest.New(t)
			l := namedRateLimiter(t, tg, "partner-api", throttle.FixedWindow{Limit: 1, Window: redistest.FarWindow})
			c := namedConcLimiter(t, tg, "pool", throttle.Concurrency{Limit: 2, Lease: time.Minute})
			log := &observetest.Log[worker.Event]{}
			var opts []worker.Option
			for range n {
				opts = append(opts, worker.WithObserver(eventObserver(log, log.Add())))
			}
			th := asynqtest.NewThrottler(t, tg, []worker.Rule{
				worker.Rate("hourly", worker.AnyTask(), l, worker.KeyBy(worker.ByType())),
				worker.Concurrency("capped", worker.AnyTask(), c, worker.KeyBy(worker.ByType())),
			}, opts...)
			runTasks(t, th, 2)
			log.CheckOrder(t, n, []string{
				"admitted ", "lease_taken capped", "lease_released capped",
				"rescheduled hourly",
			})
		})
	}
}
