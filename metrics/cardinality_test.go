package metrics_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/metrics"
	"github.com/jobthrottle/jobthrottle/metrics/workermetrics"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// tenant names caller key i; no label value may contain it.
func tenant(i int) string { return fmt.Sprintf("tenant-%06d", i) }

// observeCallers feeds the collector, for each caller key from..to-1, the
// decisions and worker events a tenant's traffic makes: every outcome of
// every op, and every worker event kind, each with the key and a task ID
// of its own.
func observeCallers(c *metrics.Collector, from, to int) {
	outcomes := []throttle.Outcome{throttle.Admitted, throttle.Throttled, throttle.Errored, throttle.Degraded}
	ops := []throttle.Op{throttle.OpAllow, throttle.OpPeek, throttle.OpReserve, throttle.OpAcquire}
	kinds := []worker.EventKind{worker.Admitted, worker.WaitedInline, worker.Rescheduled, worker.GaveUp,
		worker.Degraded, worker.Failed, worker.LeaseTaken, worker.LeaseReleased, worker.LeaseLost, worker.Unconfigured}
	o := workermetrics.Observer(c)
	for i := from; i < to; i++ {
		key := tenant(i)
		for _, op := range ops {
			for _, o := range outcomes {
				c.ObserveDecision(context.Background(), throttle.Decision{Limiter: "per-tenant", Op: op, Key: key, N: 1, Outcome: o,
					Latency: time.Millisecond, Cached: o == throttle.Throttled})
			}
		}
		for j, k := range kinds {
			o.Observe(context.Background(), worker.Event{Kind: k, TaskID: fmt.Sprintf("%s-task-%d", key, j), TaskType: "partner:sync",
				Rule: "tenant", Key: key, Delay: time.Duration(i) * time.Millisecond})
		}
	}
}

// TestCardinalityIndependentOfCallerKeys: the number of series after
// 10,000 distinct caller keys is the number after 10, and no label value
// holds a key or a task ID.
func TestCardinalityIndependentOfCallerKeys(t *testing.T) {
	c, reg := newCollector(t)
	observeCallers(c, 0, 10)
	after10 := testutil.CollectAndCount(c)
	observeCallers(c, 10, 10_000)
	if after := testutil.CollectAndCount(c); after != after10 {
		t.Fatalf("%d series after 10 caller keys, %d after 10,000", after10, after)
	}
	// 16 decision series, 4 latency histograms, 2 per-limiter counters,
	// 8 task event series, 2 wait histograms, 1 lease gauge.
	if after10 != 33 {
		t.Fatalf("%d series, want 33", after10)
	}
	checkNoCallerLabels(t, reg)
	if got := samples(t, reg)[`jobthrottle_decisions_total{limiter="per-tenant",op="allow",outcome="degraded"}`]; got != 10_000 {
		t.Fatalf("degraded allows = %v, want 10000", got)
	}
}

// TestCardinalityOfRealDecisions: distinct caller keys decided by a real
// limiter (AllowMany, a round trip per thousand keys) leave as many series
// as 10 keys do: 10,000 keys on a real Redis, 1,000 on the embedded one,
// whose Lua takes about 0.3 ms a decision.
func TestCardinalityOfRealDecisions(t *testing.T) {
	tg := redistest.New(t)
	keys := 1_000
	if tg.Real() {
		keys = 10_000
	}
	ctx := context.Background()
	c, reg := newCollector(t)
	l := newNamedLimiter(t, tg.Client, tg, "per-tenant", throttle.GCRA{Rate: throttle.PerHour(1), Burst: 1}, throttle.WithObserver(c))
	decide := func(from, to int) {
		t.Helper()
		for start := from; start < to; start += 1000 {
			var batch []throttle.Request
			for i := start; i < min(start+1000, to); i++ {
				batch = append(batch, throttle.Request{Key: tenant(i), N: 1})
			}
			if _, err := l.AllowMany(ctx, batch); err != nil {
				t.Fatal(err)
			}
		}
	}
	decide(0, 10)
	// One key over its limit, so that both outcomes exist.
	decide(0, 1)
	after10 := testutil.CollectAndCount(c)
	decide(10, keys)
	if after := testutil.CollectAndCount(c); after != after10 {
		t.Fatalf("%d series after 10 caller keys, %d after %d", after10, after, keys)
	}
	checkNoCallerLabels(t, reg)
	checkSamples(t, withPrefix(samples(t, reg), "jobthrottle_decisions_total"), map[string]float64{
		`jobthrottle_decisions_total{limiter="per-tenant",op="allow",outcome="admitted"}`:  float64(keys),
		`jobthrottle_decisions_total{limiter="per-tenant",op="allow",outcome="throttled"}`: 1,
	})
}

// checkNoCallerLabels fails the test if any label value holds a caller key
// or task ID.
func checkNoCallerLabels(t *testing.T, reg prometheus.Gatherer) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if strings.Contains(l.GetValue(), "tenant-") {
					t.Fatalf("%s has label %s=%q, a caller key", f.GetName(), l.GetName(), l.GetValue())
				}
			}
		}
	}
}
