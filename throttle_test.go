package jobthrottle_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/httpthrottle"
	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/metrics"
	"github.com/jobthrottle/jobthrottle/metrics/workermetrics"
	"github.com/jobthrottle/jobthrottle/scheduler"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
	"github.com/prometheus/client_golang/prometheus"
)

// TestEndToEnd runs the library as a user would put it together: two asynq
// servers throttle their tasks at 5/s per tenant (worker), each task calls
// a partner API through a Transport that paces all calls to it at 8/s
// (httpthrottle), a nightly batch is paced onto the tenants' limits
// (scheduler), and one Prometheus collector watches it all (metrics). The
// limiters are named, as a user whose limits may change would name them.
// Every
// task runs exactly once, no tenant and no second at the partner goes over
// its limit, nothing fails or is archived, and the metrics count exactly
// what happened.
func TestEndToEnd(t *testing.T) {
	tg := redistest.New(t)
	ctx := context.Background()
	collector, err := metrics.New()
	if err != nil {
		t.Fatal(err)
	}
	registry := prometheus.NewPedanticRegistry()
	registry.MustRegister(collector)
	limiter := func(name string, p throttle.Policy) *throttle.Limiter {
		t.Helper()
		l, err := throttle.New(tg.NewClient(t), name, p, throttle.WithPrefix(tg.Prefix), throttle.WithObserver(collector))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	perTenant := limiter("tenant", throttle.GCRA{Rate: throttle.PerSecond(5), Burst: 1})
	// The partner's limiter also tells the test its slots, on the Redis
	// clock.
	var slotsMu sync.Mutex
	var partnerSlots []time.Time
	partnerLimiter, err := throttle.New(tg.NewClient(t), "partner", throttle.GCRA{Rate: throttle.PerSecond(8), Burst: 1},
		throttle.WithPrefix(tg.Prefix),
		throttle.WithObserver(throttle.ObserverFunc(func(_ context.Context, d throttle.Decision) {
			collector.ObserveDecision(context.Background(), d)
			if d.Op == throttle.OpReserve && d.Outcome == throttle.Admitted {
				slotsMu.Lock()
				partnerSlots = append(partnerSlots, d.Slot)
				slotsMu.Unlock()
			}
		})))
	if err != nil {
		t.Fatal(err)
	}
	transport, err := httpthrottle.NewTransport(partnerLimiter)
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var calls []time.Time
	partner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls = append(calls, time.Now())
		mu.Unlock()
	}))
	t.Cleanup(partner.Close)
	httpClient := &http.Client{Transport: transport}

	var seen asynqtest.Events
	workerSeries := workermetrics.Observer(collector)
	th := asynqtest.NewThrottler(t, tg, []worker.Rule{
		worker.Rate("tenant", worker.Pattern("sync:*"), perTenant, worker.KeyBy(worker.ByPayloadField("tenant"))),
	}, worker.WithObserver(worker.ObserverFunc(func(ctx context.Context, e worker.Event) {
		workerSeries.Observe(ctx, e)
		seen.Observe(ctx, e)
	})))
	var log asynqtest.RunLog
	handler := asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		var p struct{ Tenant string }
		if err := json.Unmarshal(task.Payload(), &p); err != nil {
			return err
		}
		id, _ := asynq.GetTaskID(ctx)
		log.AddRun(asynqtest.Run{ID: worker.OriginalTaskID(ctx, task), Key: p.Tenant, TaskID: id})
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, partner.URL+"/sync?tenant="+p.Tenant, nil)
		if err != nil {
			return err
		}
		resp, err := httpClient.Do(req)
		if err != nil {
			return err
		}
		return resp.Body.Close()
	})
	f := asynqtest.NewFleet(t, tg, 2, 5, th, handler)

	var ids []string
	for i := range 12 {
		ids = append(ids, f.Enqueue(t, "sync:account", map[string]string{"tenant": "a"}))
		ids = append(ids, f.Enqueue(t, "sync:account", map[string]string{"tenant": "b", "n": fmt.Sprint(i)}))
	}
	var batch []*asynq.Task
	for i := range 10 {
		body, _ := json.Marshal(map[string]string{"tenant": "c", "n": fmt.Sprint(i)})
		batch = append(batch, asynq.NewTask("sync:nightly", body))
	}
	planned, err := scheduler.Pace(ctx, f.Client, th, "nightly-"+tg.Prefix, batch, scheduler.TaskOptions(asynq.Queue(f.Queue)))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range planned {
		ids = append(ids, p.ID)
	}

	info := f.WaitDone(t, &log, len(ids), 90*time.Second)
	runs := log.Snapshot()
	asynqtest.CheckOnce(t, runs, ids)
	if info.Archived != 0 || info.Failed != 0 {
		t.Fatalf("%d archived, %d failed", info.Archived, info.Failed)
	}
	byTenant := map[string][]asynqtest.Run{}
	for _, r := range runs {
		byTenant[r.Key] = append(byTenant[r.Key], r)
	}
	// Every tenant's tasks are admitted at the tenant's rate: no second
	// holds more than the policy, on the Redis clock, and each starts
	// within StartJitter of its admission. Tenant c's nightly batch was
	// paced by the scheduler: the tenant limiter is named (its policy may
	// change while tasks wait), so Book booked nothing and the batch waited
	// in the limiter's room, let out at the rate.
	offset := redistest.ClockOffset(t, tg.Client)
	for _, tenant := range []string{"a", "b", "c"} {
		asynqtest.CheckHeld(t, byTenant[tenant], seen.Slots(), offset, time.Second, 6)
	}
	for i, p := range planned {
		if p.StartAt.After(time.Now()) {
			t.Errorf("paced task %d planned for %s: a named limiter's batch waits in its room, not at a booked slot", i, p.StartAt)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != len(ids) {
		t.Fatalf("the partner got %d calls for %d tasks", len(calls), len(ids))
	}
	slotsMu.Lock()
	asynqtest.CheckArrivals(t, "partner", calls, partnerSlots, offset, time.Second, 9)
	slotsMu.Unlock()

	// The metrics count what happened: every task through the gate once
	// (admitted at once, or after an inline wait for the rule "tenant"),
	// every call booked once.
	ran := 0.0
	for _, event := range [][2]string{{"admitted", ""}, {"waited_inline", "tenant"}} {
		for _, tt := range []string{"sync:account", "sync:nightly"} {
			ran += counterValue(t, registry, "jobthrottle_worker_tasks_total", map[string]string{"task_type": tt, "event": event[0], "rule": event[1]})
		}
	}
	if int(ran) != len(ids) {
		t.Errorf("metrics: %v tasks through the gate, want %d", ran, len(ids))
	}
	booked := counterValue(t, registry, "jobthrottle_decisions_total", map[string]string{"limiter": "partner", "op": "reserve", "outcome": "admitted"})
	if int(booked) != len(ids) {
		t.Errorf("metrics: %v partner calls booked, want %d", booked, len(ids))
	}
	took := runs[len(runs)-1].At.Sub(runs[0].At)
	t.Logf("figures: %s: %d tasks (10 paced by the scheduler) in %s; most in any second: partner %d (limit 9), tenants a %d, b %d, paced c %d (limit 6); archived 0, failed 0",
		tg.Kind, len(ids), took.Round(100*time.Millisecond), asynqtest.MostInAnyTimeWindow(calls, time.Second),
		asynqtest.MostInAnyWindow(byTenant["a"], time.Second), asynqtest.MostInAnyWindow(byTenant["b"], time.Second),
		asynqtest.MostInAnyWindow(byTenant["c"], time.Second))
}

// counterValue returns the value of the counter name whose labels are
// labels, 0 when there is none.
func counterValue(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, lp := range m.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue next
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}
