package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
)

// TestPlansAndCostsOnOneRule: one rule, keyed by tenant, whose limiter
// gives the tenant "pro" 20 units a second and every other tenant 5
// (throttle.WithPlan); every task costs 2 units (worker.Cost). The limiter
// is unnamed, so its tasks book their slots and come back through the
// return lane. Every task runs once; on the Redis clock each tenant's
// units stay within its plan (20/s or 5/s, burst 2); the pro tenant's 40
// tasks are admitted over about 4 s on the Redis clock, where the free plan
// would take 16 s.
func TestPlansAndCostsOnOneRule(t *testing.T) {
	tg := redistest.New(t)
	pro := throttle.GCRA{Rate: throttle.PerSecond(20), Burst: 2}
	plan := throttle.WithPlan(func(_ context.Context, tenant string) throttle.Policy {
		if tenant == "pro" {
			return pro
		}
		return nil
	})
	limiter, err := throttle.New(tg.NewClient(t), "limiter", throttle.GCRA{Rate: throttle.PerSecond(5), Burst: 2}, throttle.WithPrefix(tg.Prefix), plan)
	if err != nil {
		t.Fatal(err)
	}
	var seen asynqtest.Events
	two := func(context.Context, *asynq.Task) (int, error) { return 2, nil }
	th := asynqtest.NewThrottler(t, tg, []worker.Rule{
		worker.Rate("tenant", worker.AnyTask(), limiter, worker.KeyBy(worker.ByPayloadField("tenant")), worker.Cost(two)),
	}, worker.WithObserver(&seen))
	var log asynqtest.RunLog
	f := asynqtest.NewFleet(t, tg, 2, 10, th, log.Handler(5*time.Millisecond))
	var ids []string
	for i := range 40 {
		ids = append(ids, f.Enqueue(t, "sync", map[string]any{"tenant": "pro", "n": i}))
		if i%3 == 0 {
			ids = append(ids, f.Enqueue(t, "sync", map[string]any{"tenant": "free", "n": i}))
		}
	}
	info := f.WaitDone(t, &log, len(ids), 60*time.Second)
	runs := log.Snapshot()
	asynqtest.CheckOnce(t, runs, ids)
	if info.Archived != 0 || info.Failed != 0 {
		t.Errorf("%d archived, %d failed; want none", info.Archived, info.Failed)
	}
	slots := seen.Slots()
	byTenant := map[string][]asynqtest.Admission{}
	last := map[string]time.Time{}
	for _, r := range runs {
		byTenant[r.Key] = append(byTenant[r.Key], asynqtest.Admission{At: slots[r.TaskID], Units: 2})
		last[r.Key] = r.At
	}
	asynqtest.CheckMeterUnits(t, byTenant["pro"], pro.Rate, 2)
	asynqtest.CheckMeterUnits(t, byTenant["free"], throttle.PerSecond(5), 2)
	// On the Redis clock, 40 tasks of 2 units take 3.9 s at the pro plan's
	// 20/s, and 15.9 s at the free plan's 5/s: a span under 8 s is the pro
	// plan at work.
	span := func(as []asynqtest.Admission) time.Duration {
		first, final := as[0].At, as[0].At
		for _, a := range as {
			first, final = minTime(first, a.At), maxTime(final, a.At)
		}
		return final.Sub(first)
	}
	t.Logf("figures: pro's 40 tasks admitted over %s, free's %d over %s (Redis clock); done after %s and %s",
		span(byTenant["pro"]).Round(time.Millisecond), len(byTenant["free"]), span(byTenant["free"]).Round(time.Millisecond),
		last["pro"].Sub(runs[0].At).Round(time.Millisecond), last["free"].Sub(runs[0].At).Round(time.Millisecond))
	if d := span(byTenant["pro"]); d > 8*time.Second {
		t.Errorf("the pro tenant's 40 tasks were admitted over %s; its plan does it in 3.9 s, the free plan in 15.9 s", d)
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
