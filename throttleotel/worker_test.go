package throttleotel_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// TestAsynqFleetTracesAndCounts runs a real fleet of two asynq servers
// whose handlers are traced (a middleware outside the Throttler's starts
// a span per run, as a user's tracing middleware would). Twelve tasks of
// one tenant come at once under a rate of 5/s and a cap of 2: some wait
// in their handler, some go back to asynq. Every event the Throttler
// reported must be on the span of the run it happened in, each inline wait
// a child span of it, and the metrics must count what the events say.
func TestAsynqFleetTracesAndCounts(t *testing.T) {
	tg := redistest.New(t)
	tm := newTelemetry(t)
	rate, err := throttle.New(tg.NewClient(t), "tenant-rate", throttle.GCRA{Rate: throttle.PerSecond(5), Burst: 1},
		throttle.WithPrefix(tg.Prefix), throttle.WithObserver(tm.inst))
	if err != nil {
		t.Fatal(err)
	}
	cap2, err := throttle.NewConcurrencyLimiter(tg.NewClient(t), "tenant-cap", throttle.Concurrency{Limit: 2, Lease: 30 * time.Second},
		throttle.WithPrefix(tg.Prefix), throttle.WithObserver(tm.inst))
	if err != nil {
		t.Fatal(err)
	}
	byTenant := worker.KeyBy(worker.ByPayloadField("tenant"))
	var seen asynqtest.Events
	th := asynqtest.NewThrottler(t, tg, []worker.Rule{
		worker.Rate("rate", worker.Pattern("sync:*"), rate, byTenant),
		worker.Concurrency("cap", worker.Pattern("sync:*"), cap2, byTenant),
	}, worker.WithObserver(tm.inst), worker.WithObserver(&seen))

	var log asynqtest.RunLog
	handler := log.Handler(150 * time.Millisecond)
	traced := func(h asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
			id, _ := asynq.GetTaskID(ctx)
			ctx, span := tm.tracer.Start(ctx, "asynq.task", trace.WithAttributes(attribute.String("test.task_id", id)))
			defer span.End()
			return h.ProcessTask(ctx, task)
		})
	}
	fleet := asynqtest.NewFleet(t, tg, 0, 0, th, nil)
	for range 2 {
		cfg := asynq.Config{Concurrency: 4, Queues: map[string]int{fleet.Queue: 1}, LogLevel: asynq.FatalLevel, ShutdownTimeout: 3 * time.Second}
		th.Configure(&cfg)
		srv := asynq.NewServerFromRedisClient(tg.NewClient(t), cfg)
		t.Cleanup(srv.Shutdown)
		if err := srv.Start(traced(th.Middleware(handler))); err != nil {
			t.Fatal(err)
		}
	}
	const tasks = 12
	for range tasks {
		fleet.Enqueue(t, "sync:orders", map[string]string{"tenant": "acme"})
	}
	fleet.WaitDone(t, &log, tasks, 60*time.Second)

	// Every event is on the span of a run; count them by kind.
	runs := tm.ended("asynq.task")
	onSpans := map[string]int{}
	decisions := 0
	for _, run := range runs {
		for _, e := range events(run, "throttle.task") {
			kind, _ := attr(e.Attributes, "jobthrottle.task.event")
			onSpans[kind.AsString()]++
			if kind.AsString() == "rescheduled" {
				reason, _ := attr(e.Attributes, "jobthrottle.reason")
				rule, _ := attr(e.Attributes, "jobthrottle.rule")
				limiter, _ := attr(e.Attributes, "jobthrottle.limiter.name")
				delay, _ := attr(e.Attributes, "jobthrottle.delay")
				if reason.AsString() != "throttled" || (rule.AsString() != "rate" && rule.AsString() != "cap") ||
					limiter.AsString() != "tenant-"+rule.AsString() || delay.AsFloat64() <= 0 {
					t.Errorf("rescheduled event %v: want reason throttled, the rule, its limiter and a delay", attrs(e.Attributes))
				}
			}
		}
		for _, e := range events(run, "throttle.decision") {
			decisions++
			if limiter, _ := attr(e.Attributes, "jobthrottle.limiter.name"); limiter.AsString() != "tenant-rate" && limiter.AsString() != "tenant-cap" {
				t.Errorf("decision event of limiter %q", limiter.AsString())
			}
		}
	}
	want := map[string]int{}
	for k, n := range seen.ByKind() {
		want[k.String()] = n
	}
	if fmt.Sprint(onSpans) != fmt.Sprint(want) {
		t.Errorf("events on the runs' spans %v; the Throttler reported %v", onSpans, want)
	}
	if want["admitted"]+want["waited_inline"] != tasks || want["lease_taken"] != tasks || want["lease_released"] != tasks {
		t.Errorf("events %v: want %d tasks admitted (at once or after waiting), each taking and releasing a lease", want, tasks)
	}
	t.Logf("events: %v; decisions on the runs' spans: %d", want, decisions)
	if want["rescheduled"]+want["waited_inline"] == 0 {
		t.Errorf("events %v: no task was held back; the test proves nothing", want)
	}
	if decisions == 0 {
		t.Errorf("no limiter decision on any run's span")
	}

	// Each inline wait is a child span of its run's span.
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, run := range runs {
		byID[run.SpanContext().SpanID()] = run
	}
	waits := tm.ended("throttle.wait")
	inline := 0
	for _, w := range waits {
		run, ok := byID[w.Parent().SpanID()]
		if !ok {
			t.Errorf("throttle.wait %v has no run as its parent", attrs(w.Attributes()))
			continue
		}
		if kind, _ := attr(w.Attributes(), "jobthrottle.task.event"); kind.AsString() == "waited_inline" {
			inline++
		}
		if w.StartTime().Before(run.StartTime()) || w.EndTime().After(run.EndTime()) {
			t.Errorf("throttle.wait [%s, %s] outside its run [%s, %s]", w.StartTime(), w.EndTime(), run.StartTime(), run.EndTime())
		}
	}
	if inline != want["waited_inline"] {
		t.Errorf("%d inline wait spans, %d waited_inline events", inline, want["waited_inline"])
	}

	// The metrics count what the events say.
	points := tm.metrics(t)
	for kind, n := range want {
		var got float64
		switch kind {
		case "lease_taken", "lease_released":
			continue
		default:
			for _, rule := range []string{"", "rate", "cap"} {
				got += points[fmt.Sprintf("jobthrottle.worker.tasks{jobthrottle.rule=%s,jobthrottle.task.event=%s,jobthrottle.task.type=sync:orders}", rule, kind)]
			}
		}
		if got != float64(n) {
			t.Errorf("jobthrottle.worker.tasks of %s = %v, want %d", kind, got, n)
		}
	}
	for _, kind := range []string{"waited_inline", "rescheduled"} {
		k := fmt.Sprintf("jobthrottle.worker.wait.duration_count{jobthrottle.task.event=%s,jobthrottle.task.type=sync:orders}", kind)
		if points[k] != float64(want[kind]) {
			t.Errorf("%s = %v, want %d", k, points[k], want[kind])
		}
	}
	if got := points["jobthrottle.worker.lease.active{jobthrottle.rule=cap}"]; got != 0 {
		t.Errorf("leases active after the fleet is done: %v, want 0", got)
	}
}
