package metrics_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/metrics"
	"github.com/jobthrottle/jobthrottle/metrics/workermetrics"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
)

// TestWorkerEventsExactCounts feeds known events and scrapes exact counts,
// histogram sums included.
func TestWorkerEventsExactCounts(t *testing.T) {
	c, reg := newCollector(t, metrics.WithWaitBuckets(0.5, 5))
	events := []worker.Event{
		{Kind: worker.Admitted, TaskID: "t1", TaskType: "sync"},
		{Kind: worker.Admitted, TaskID: "t2", TaskType: "sync"},
		{Kind: worker.WaitedInline, TaskID: "t3", TaskType: "sync", Delay: 250 * time.Millisecond},
		{Kind: worker.WaitedInline, TaskID: "t4", TaskType: "sync", Delay: 500 * time.Millisecond},
		{Kind: worker.Rescheduled, TaskID: "t5", TaskType: "sync", Rule: "tenant", Key: "acme", Delay: 2 * time.Second},
		{Kind: worker.Rescheduled, TaskID: "t6", TaskType: "export", Rule: "exports", Key: "acme", Delay: 8 * time.Second},
		{Kind: worker.GaveUp, TaskID: "t7", TaskType: "sync", Rule: "tenant", Key: "acme", Throttles: 10},
		{Kind: worker.Degraded, TaskID: "t8", TaskType: "sync", Err: throttle.ErrUnavailable},
		{Kind: worker.Failed, TaskID: "t9", TaskType: "export", Rule: "exports", Key: "acme", Err: throttle.ErrUnavailable},
		{Kind: worker.LeaseTaken, TaskID: "t10", TaskType: "export", Rule: "exports", Key: "acme"},
		{Kind: worker.LeaseTaken, TaskID: "t11", TaskType: "export", Rule: "exports", Key: "beta"},
		{Kind: worker.LeaseReleased, TaskID: "t10", TaskType: "export", Rule: "exports", Key: "acme"},
		{Kind: worker.LeaseTaken, TaskID: "t12", TaskType: "export", Rule: "other", Key: "acme"},
		{Kind: worker.LeaseReleased, TaskID: "t12", TaskType: "export", Rule: "other", Key: "acme"},
		// A task type that is not valid UTF-8 is kept, not refused.
		{Kind: worker.Admitted, TaskID: "t13", TaskType: "bad\xffname"},
	}
	o := workermetrics.Observer(c)
	for _, e := range events {
		o.Observe(context.Background(), e)
	}
	compare(t, c, `
# HELP jobthrottle_worker_tasks_total Decisions of jobthrottle's asynq middleware about tasks, by task type, rule and event (admitted, waited_inline, rescheduled, gave_up, degraded, failed, lease_lost, unconfigured).
# TYPE jobthrottle_worker_tasks_total counter
jobthrottle_worker_tasks_total{event="admitted",rule="",task_type="bad`+"\uFFFD"+`name"} 1
jobthrottle_worker_tasks_total{event="admitted",rule="",task_type="sync"} 2
jobthrottle_worker_tasks_total{event="degraded",rule="",task_type="sync"} 1
jobthrottle_worker_tasks_total{event="failed",rule="exports",task_type="export"} 1
jobthrottle_worker_tasks_total{event="gave_up",rule="tenant",task_type="sync"} 1
jobthrottle_worker_tasks_total{event="rescheduled",rule="exports",task_type="export"} 1
jobthrottle_worker_tasks_total{event="rescheduled",rule="tenant",task_type="sync"} 1
jobthrottle_worker_tasks_total{event="waited_inline",rule="",task_type="sync"} 2
# HELP jobthrottle_worker_wait_seconds How long throttled tasks waited in their handler (waited_inline) or were sent away for (rescheduled), by task type and event.
# TYPE jobthrottle_worker_wait_seconds histogram
jobthrottle_worker_wait_seconds_bucket{event="rescheduled",task_type="export",le="0.5"} 0
jobthrottle_worker_wait_seconds_bucket{event="rescheduled",task_type="export",le="5"} 0
jobthrottle_worker_wait_seconds_bucket{event="rescheduled",task_type="export",le="+Inf"} 1
jobthrottle_worker_wait_seconds_sum{event="rescheduled",task_type="export"} 8
jobthrottle_worker_wait_seconds_count{event="rescheduled",task_type="export"} 1
jobthrottle_worker_wait_seconds_bucket{event="rescheduled",task_type="sync",le="0.5"} 0
jobthrottle_worker_wait_seconds_bucket{event="rescheduled",task_type="sync",le="5"} 1
jobthrottle_worker_wait_seconds_bucket{event="rescheduled",task_type="sync",le="+Inf"} 1
jobthrottle_worker_wait_seconds_sum{event="rescheduled",task_type="sync"} 2
jobthrottle_worker_wait_seconds_count{event="rescheduled",task_type="sync"} 1
jobthrottle_worker_wait_seconds_bucket{event="waited_inline",task_type="sync",le="0.5"} 2
jobthrottle_worker_wait_seconds_bucket{event="waited_inline",task_type="sync",le="5"} 2
jobthrottle_worker_wait_seconds_bucket{event="waited_inline",task_type="sync",le="+Inf"} 2
jobthrottle_worker_wait_seconds_sum{event="waited_inline",task_type="sync"} 0.75
jobthrottle_worker_wait_seconds_count{event="waited_inline",task_type="sync"} 2
# HELP jobthrottle_worker_leases_held Concurrency leases held by running tasks in this process, by rule.
# TYPE jobthrottle_worker_leases_held gauge
jobthrottle_worker_leases_held{rule="exports"} 1
jobthrottle_worker_leases_held{rule="other"} 0
`, "jobthrottle_worker_tasks_total", "jobthrottle_worker_wait_seconds", "jobthrottle_worker_leases_held")
	// Worker events make no limiter series.
	if n := len(withPrefix(samples(t, reg), "jobthrottle_decision")); n != 0 {
		t.Fatalf("%d decision series from worker events", n)
	}
}

// TestWorkerRedisDown: a task gated by a concurrency rule whose Redis is
// down fails the decision and goes back under fail-closed, and runs
// degraded under fail-open, holding no lease.
func TestWorkerRedisDown(t *testing.T) {
	for _, tc := range []struct {
		policy   throttle.FailurePolicy
		ran      bool
		expected string
	}{
		{throttle.FailClosed, false, `
jobthrottle_decisions_total{limiter="exports",op="acquire",outcome="error"} 1
jobthrottle_redis_errors_total{limiter="exports"} 1
jobthrottle_worker_tasks_total{event="failed",rule="exports",task_type="export"} 1
jobthrottle_worker_tasks_total{event="rescheduled",rule="exports",task_type="export"} 1
jobthrottle_worker_wait_seconds_count{event="rescheduled",task_type="export"} 1
`},
		{throttle.FailOpen, true, `
jobthrottle_decisions_total{limiter="exports",op="acquire",outcome="degraded"} 1
jobthrottle_redis_errors_total{limiter="exports"} 1
jobthrottle_worker_tasks_total{event="degraded",rule="",task_type="export"} 1
`},
	} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			down := deadClient(t)
			c, registry := newCollector(t)
			exports := newNamedConcurrency(t, down, "x:", "exports", throttle.Concurrency{Limit: 1, Lease: time.Minute}, throttle.WithFailurePolicy(tc.policy), throttle.WithObserver(c), throttle.WithLogger(nil))
			th, err := worker.New(down, []worker.Rule{worker.Concurrency("exports", worker.Type("export"), exports, worker.KeyBy(worker.ByType()))},
				worker.WithObserver(workermetrics.Observer(c)), worker.WithLogger(nil), worker.WithSettle(false))
			if err != nil {
				t.Fatal(err)
			}
			ran := false
			// Called directly, outside an asynq server: no task ID, and
			// retries left, so a refused task goes back with an error.
			err = th.Middleware(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
				ran = true
				return nil
			})).ProcessTask(context.Background(), asynq.NewTask("export", nil))
			var throttled *worker.ThrottledError
			if ran != tc.ran || (tc.ran != (err == nil)) || (!tc.ran && !errors.As(err, &throttled)) {
				t.Fatalf("ran %v, err %v; want ran %v (a ThrottledError otherwise)", ran, err, tc.ran)
			}
			s := samples(t, registry)
			got := map[string]float64{}
			for _, prefix := range []string{"jobthrottle_decisions_total", "jobthrottle_redis_errors_total", "jobthrottle_worker_"} {
				for k, v := range withPrefix(s, prefix) {
					if !isWaitSum(k) {
						got[k] = v
					}
				}
			}
			checkSamples(t, got, parseSamples(t, tc.expected))
		})
	}
}

// TestWorkerFleetEndToEnd: a real asynq fleet under a concurrency rule;
// the worker series match the events the Throttler reported, and the
// lease gauge returns to 0.
func TestWorkerFleetEndToEnd(t *testing.T) {
	tg := redistest.New(t)
	c, registry := newCollector(t)
	exports := newNamedConcurrency(t, tg.NewClient(t), tg.Prefix, "exports", throttle.Concurrency{Limit: 2, Lease: 5 * time.Second}, throttle.WithObserver(c))
	var events asynqtest.Events
	o := workermetrics.Observer(c)
	both := worker.ObserverFunc(func(ctx context.Context, e worker.Event) {
		o.Observe(ctx, e)
		events.Observe(ctx, e)
	})
	th := asynqtest.NewThrottler(t, tg, []worker.Rule{worker.Concurrency("exports", worker.Type("export"), exports, worker.KeyBy(worker.ByType()))},
		worker.WithObserver(both))
	var log asynqtest.RunLog
	handler := asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		log.Add(worker.OriginalTaskID(ctx, task), "")
		time.Sleep(time.Duration(20+rand.IntN(20)) * time.Millisecond)
		return nil
	})
	f := asynqtest.NewFleet(t, tg, 2, 4, th, handler)
	const tasks = 12
	var ids []string
	for i := range tasks {
		ids = append(ids, f.Enqueue(t, "export", map[string]int{"n": i}))
	}
	info := f.WaitDone(t, &log, tasks, 30*time.Second)
	asynqtest.CheckOnce(t, log.Snapshot(), ids)
	if info.Archived != 0 || info.Failed != 0 {
		t.Fatalf("%d archived, %d failed", info.Archived, info.Failed)
	}
	// The last release is reported just after its handler returns.
	leases := `jobthrottle_worker_leases_held{rule="exports"}`
	deadline := time.Now().Add(5 * time.Second)
	for samples(t, registry)[leases] != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}

	byKind := events.ByKind()
	if byKind[worker.LeaseTaken] != tasks || byKind[worker.LeaseReleased] != tasks {
		t.Fatalf("lease events %v; want %d taken and released", byKind, tasks)
	}
	if ran := byKind[worker.Admitted] + byKind[worker.WaitedInline]; ran != tasks {
		t.Fatalf("events %v: %d admitted or waited, want %d", byKind, ran, tasks)
	}
	// The series hold exactly what the events say.
	want := map[string]float64{leases: 0}
	waited := map[string]float64{}
	for _, e := range events.All() {
		switch e.Kind {
		case worker.LeaseTaken, worker.LeaseReleased:
			continue
		case worker.WaitedInline, worker.Rescheduled:
			waited[e.Kind.String()] += e.Delay.Seconds()
			want[`jobthrottle_worker_wait_seconds_count{event="`+e.Kind.String()+`",task_type="export"}`]++
		}
		want[`jobthrottle_worker_tasks_total{event="`+e.Kind.String()+`",rule="`+e.Rule+`",task_type="export"}`]++
	}
	got := samples(t, registry)
	for kind, sum := range waited {
		key := `jobthrottle_worker_wait_seconds_sum{event="` + kind + `",task_type="export"}`
		if math.Abs(got[key]-sum) > 1e-9 {
			t.Errorf("%s = %v, want %v", key, got[key], sum)
		}
	}
	workerSeries := map[string]float64{}
	for k, v := range withPrefix(got, "jobthrottle_worker_") {
		if !isWaitSum(k) {
			workerSeries[k] = v
		}
	}
	checkSamples(t, workerSeries, want)
	// Every task took its lease exactly once; nothing failed or degraded.
	if n := got[`jobthrottle_decisions_total{limiter="exports",op="acquire",outcome="admitted"}`]; n != tasks {
		t.Fatalf("%v admitted acquires, want %d", n, tasks)
	}
	for k, v := range withPrefix(got, "jobthrottle_decisions_total") {
		if v != 0 && !strings.Contains(k, `outcome="admitted"`) && !strings.Contains(k, `outcome="throttled"`) {
			t.Errorf("%s = %v, want none", k, v)
		}
	}
	t.Logf("events: %v", byKind)
}
