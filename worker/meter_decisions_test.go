package worker_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
)

// TestMeterStartsReachTheLimitersObserver: a TokenBucket or GCRA limiter
// that only the worker uses reports each task's start to its observer (a
// metrics Collector, a dashboard Publisher): admitted when the task may
// start, throttled when it is sent back.
func TestMeterStartsReachTheLimitersObserver(t *testing.T) {
	for _, tc := range []struct {
		p    throttle.Policy
		live bool // tasks wait in its room, not by booking
	}{
		{throttle.GCRA{Rate: throttle.PerHour(1), Burst: 2}, false},
		{throttle.TokenBucket{Rate: throttle.PerHour(1), Burst: 2}, false},
		{throttle.GCRA{Rate: throttle.PerHour(1), Burst: 2}, true},
	} {
		p := tc.p
		t.Run(fmt.Sprintf("%s, live %v", p, tc.live), func(t *testing.T) {
			tg := redistest.New(t)
			var mu sync.Mutex
			count := map[throttle.Outcome]int{}
			var slots []time.Time
			obs := throttle.ObserverFunc(func(_ context.Context, d throttle.Decision) {
				mu.Lock()
				defer mu.Unlock()
				if d.Op == throttle.OpPeek {
					return
				}
				count[d.Outcome]++
				if d.Outcome == throttle.Admitted {
					if d.Limiter != "partner-api" || d.Policy != p.String() || d.PolicySource != throttle.SourceCode || d.Key != "" && d.Key != "all" {
						t.Errorf("decision %+v: want the limiter's name, policy and source", d)
					}
					slots = append(slots, d.Slot)
				}
			})
			opts := []throttle.Option{throttle.WithObserver(obs)}
			if tc.live {
				opts = append(opts, throttle.WithLivePolicies())
			}
			l := namedRateLimiter(t, tg, "partner-api", p, opts...)
			th, err := worker.New(tg.Client, []worker.Rule{worker.Rate("partner", worker.AnyTask(), l, worker.KeyBy(worker.Constant("all")))},
				worker.WithPrefix(tg.Prefix), worker.WithInlineWait(0))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = th.Close(t.Context()) })
			errs := runTasks(t, th, 3)
			if errs[0] != nil || errs[1] != nil || errs[2] == nil {
				t.Fatalf("tasks returned %v; want two run and the third sent back", errs)
			}
			mu.Lock()
			defer mu.Unlock()
			if count[throttle.Admitted] != 2 || count[throttle.Throttled] < 1 {
				t.Fatalf("the observer saw %d admitted and %d throttled decisions; want 2 and at least 1", count[throttle.Admitted], count[throttle.Throttled])
			}
			for _, s := range slots {
				if s.IsZero() {
					t.Errorf("an admitted start without its slot: %v", slots)
				}
			}
		})
	}
}

// TestEveryRuleATaskPassedCountsIt: under a per-tenant limit and an
// overall one shared fairly (the tasks wait in the overall rule's room and
// are booked on the per-tenant rule as they are let out), each limiter's
// observer sees one admitted decision per task and tenant, so that
// metrics and the dashboard count every limit a task passed (before, the
// per-tenant limiter reported nothing). A booking made at a release is
// counted when the task starts by it, so a task late for its slot, booked
// again, still counts once (before, CI saw 13 admitted for 12 tasks).
func TestEveryRuleATaskPassedCountsIt(t *testing.T) {
	tg := redistest.New(t)
	var mu sync.Mutex
	admitted := map[string]int{} // limiter/key
	obs := throttle.ObserverFunc(func(_ context.Context, d throttle.Decision) {
		if d.Outcome == throttle.Admitted && d.Op != throttle.OpPeek {
			mu.Lock()
			admitted[d.Limiter+"/"+d.Key]++
			mu.Unlock()
		}
	})
	perTenant := namedRateLimiter(t, tg, "partner-per-tenant", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1}, throttle.WithObserver(obs))
	overall := namedRateLimiter(t, tg, "partner-overall", throttle.GCRA{Rate: throttle.PerSecond(15), Burst: 1}, throttle.WithObserver(obs))
	tenant := worker.ByPayloadField("tenant")
	th := asynqtest.NewThrottler(t, tg, []worker.Rule{
		worker.Rate("tenant", worker.Type("partner:sync"), perTenant, worker.KeyBy(tenant)),
		worker.Rate("overall", worker.Type("partner:sync"), overall, worker.KeyBy(worker.Constant("all")), worker.FairBy(tenant)),
	})
	var log asynqtest.RunLog
	f := asynqtest.NewFleet(t, tg, 2, 5, th, log.Handler(time.Millisecond))
	tasks := map[string]int{"acme": 20, "globex": 10, "initech": 10}
	total := 0
	for name, n := range tasks {
		for range n {
			f.Enqueue(t, "partner:sync", map[string]string{"tenant": name})
		}
		total += n
	}
	f.WaitDone(t, &log, total, 30*time.Second)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("figures: admitted decisions by limiter and key: %v", admitted)
	for name, n := range tasks {
		if got := admitted["partner-per-tenant/"+name]; got != n {
			t.Errorf("partner-per-tenant, %s: %d admitted decisions for %d tasks", name, got, n)
		}
	}
	if got := admitted["partner-overall/all"]; got != total {
		t.Errorf("partner-overall: %d admitted decisions for %d tasks", got, total)
	}
}
