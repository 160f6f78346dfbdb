package worker_test

import (
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
)

// TestFleetHoldsTheRate: two asynq servers (Concurrency 10 each) process
// 150 tasks of one type under 20/s. Every task runs exactly once, none is
// archived or failed; no 1-second window holds more admissions than the
// policy allows (20 per second plus its burst of 1) on the Redis clock,
// where the limiter decides them; no handler starts later than
// StartJitter after its admission, so no window of a second less that
// jitter holds more starts; and the whole takes within 15% of the ideal
// 7.45 s. (It ran 300 tasks, 15 s, for no more certainty: every window
// after the first second is alike.)
func TestFleetHoldsTheRate(t *testing.T) {
	tg := redistest.New(t)
	limiter := asynqtest.NewLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(20), Burst: 1})
	var seen asynqtest.Events
	th := asynqtest.NewThrottler(t, tg, []worker.Rule{worker.Rate("email", worker.Type("email:send"), limiter, worker.KeyBy(worker.ByType()))},
		worker.WithObserver(&seen))
	var log asynqtest.RunLog
	f := asynqtest.NewFleet(t, tg, 2, 10, th, log.Handler(5*time.Millisecond))
	var ids []string
	const tasks = 150
	for i := range tasks {
		ids = append(ids, f.Enqueue(t, "email:send", map[string]int{"n": i}))
	}
	info := f.WaitDone(t, &log, tasks, 60*time.Second)
	runs := log.Snapshot()
	asynqtest.CheckOnce(t, runs, ids)
	if info.Archived != 0 || info.Failed != 0 {
		t.Errorf("queue after the run: %d archived, %d failed; want 0 and 0", info.Archived, info.Failed)
	}
	asynqtest.CheckHeld(t, runs, seen.Slots(), redistest.ClockOffset(t, tg.Client), time.Second, 21)
	took := runs[len(runs)-1].At.Sub(runs[0].At)
	if ideal := (tasks - 1) * 50 * time.Millisecond; took < ideal-50*time.Millisecond || took > ideal*115/100 {
		t.Errorf("%d tasks took %s; ideal %s, allowed up to 15%% more", tasks, took, ideal)
	}
	for _, e := range seen.All() {
		if e.Kind == worker.WaitedInline && (e.Rule != "email" || e.Key != "email:send" || e.Delay <= 0) {
			t.Fatalf("an inline wait reported as %+v; want the rule, the key and the wait", e)
		}
	}
	t.Logf("%d tasks in %s; events: %v", tasks, took, seen.ByKind())
}

// TestTenantsAreHeldApart: three tenants' tasks interleaved under 5/s per
// tenant. Each tenant is held to its own rate, and the big tenant's backlog
// does not hold back the two small ones.
func TestTenantsAreHeldApart(t *testing.T) {
	tg := redistest.New(t)
	limiter := asynqtest.NewLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(5), Burst: 1})
	th := asynqtest.NewThrottler(t, tg, []worker.Rule{
		worker.Rate("tenant", worker.Pattern("partner:*"), limiter, worker.KeyBy(worker.ByPayloadField("tenant"))),
	})
	var log asynqtest.RunLog
	f := asynqtest.NewFleet(t, tg, 2, 10, th, log.Handler(5*time.Millisecond))
	var ids []string
	for i := range 40 {
		ids = append(ids, f.Enqueue(t, "partner:sync", map[string]string{"tenant": "big"}))
		if i%4 == 0 {
			ids = append(ids, f.Enqueue(t, "partner:sync", map[string]string{"tenant": "small-1"}))
			ids = append(ids, f.Enqueue(t, "partner:sync", map[string]string{"tenant": "small-2"}))
		}
	}
	f.WaitDone(t, &log, len(ids), 60*time.Second)
	runs := log.Snapshot()
	asynqtest.CheckOnce(t, runs, ids)
	byTenant := map[string][]asynqtest.Run{}
	for _, r := range runs {
		byTenant[r.Key] = append(byTenant[r.Key], r)
	}
	for tenant, rs := range byTenant {
		if most := asynqtest.MostInAnyWindow(rs, time.Second); most > 6 {
			t.Errorf("tenant %s: %d tasks within one second; its limit allows 6 (5/s and a burst of 1)", tenant, most)
		}
	}
	start := runs[0].At
	for _, small := range []string{"small-1", "small-2"} {
		rs := byTenant[small]
		// 10 tasks at 5/s: 1.8 s, were the tenant alone.
		if took := rs[len(rs)-1].At.Sub(start); took > 4*time.Second {
			t.Errorf("tenant %s finished %s after the start: held back by the big tenant", small, took)
		}
	}
	big := byTenant["big"]
	t.Logf("big tenant: 40 tasks in %s; small ones done after %s and %s", big[len(big)-1].At.Sub(start),
		byTenant["small-1"][9].At.Sub(start), byTenant["small-2"][9].At.Sub(start))
}

// TestTasksWithoutRetriesAreNeverArchived: tasks enqueued with MaxRetry(0)
// that are throttled still run, once each; none is archived.
func TestTasksWithoutRetriesAreNeverArchived(t *testing.T) {
	tg := redistest.New(t)
	limiter := asynqtest.NewLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1})
	th := asynqtest.NewThrottler(t, tg, []worker.Rule{worker.Rate("r", worker.AnyTask(), limiter, worker.KeyBy(worker.ByType()))})
	var log asynqtest.RunLog
	f := asynqtest.NewFleet(t, tg, 2, 10, th, log.Handler(0))
	var ids []string
	for i := range 30 {
		ids = append(ids, f.Enqueue(t, "report", map[string]int{"n": i}, asynq.MaxRetry(0)))
	}
	info := f.WaitDone(t, &log, 30, 60*time.Second)
	asynqtest.CheckOnce(t, log.Snapshot(), ids)
	if info.Archived != 0 || info.Failed != 0 {
		t.Fatalf("%d archived, %d failed; want none", info.Archived, info.Failed)
	}
}

// TestTasksWithoutRetriesAreHandedOver: a task with no retries left whose
// turn comes after its deadline is handed over to a copy that runs at its
// turn; the original is not archived, and the handler sees its ID.
func TestTasksWithoutRetriesAreHandedOver(t *testing.T) {
	tg := redistest.New(t)
	limiter := asynqtest.NewLimiter(t, tg, throttle.GCRA{Rate: throttle.Rate{N: 1, Per: 3 * time.Second}, Burst: 1})
	var seen asynqtest.Events
	th := asynqtest.NewThrottler(t, tg, []worker.Rule{worker.Rate("slow", worker.AnyTask(), limiter, worker.KeyBy(worker.ByType()))}, worker.WithObserver(&seen))
	var log asynqtest.RunLog
	f := asynqtest.NewFleet(t, tg, 1, 5, th, log.Handler(0))
	var ids []string
	for i := range 3 {
		// 2 s per attempt: the second task's turn (3 s) and the third's (6 s)
		// are past the deadline.
		ids = append(ids, f.Enqueue(t, "export", map[string]int{"n": i}, asynq.MaxRetry(0), asynq.Timeout(2*time.Second)))
	}
	info := f.WaitDone(t, &log, 3, 30*time.Second)
	runs := log.Snapshot()
	asynqtest.CheckOnce(t, runs, ids)
	if info.Archived != 0 || info.Failed != 0 {
		t.Fatalf("%d archived, %d failed; want none", info.Archived, info.Failed)
	}
	if gap := runs[2].At.Sub(runs[0].At); gap < 6*time.Second-100*time.Millisecond {
		t.Fatalf("three tasks at 1 per 3s ran within %s", gap)
	}
	if seen.Count(worker.Rescheduled) < 2 {
		t.Fatalf("events %v: want the two late tasks handed over", seen.ByKind())
	}
}
