package metrics_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/metrics"
	"github.com/jobthrottle/jobthrottle/metrics/workermetrics"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

func TestNewRejectsBadOptions(t *testing.T) {
	for name, opt := range map[string]metrics.Option{
		"nil option":                nil,
		"empty namespace":           metrics.WithNamespace(""),
		"namespace with a dash":     metrics.WithNamespace("job-throttle"),
		"namespace with a colon":    metrics.WithNamespace("job:throttle"),
		"namespace starting digit":  metrics.WithNamespace("1jobs"),
		"namespace not ASCII":       metrics.WithNamespace("jöbs"),
		"no latency buckets":        metrics.WithLatencyBuckets(),
		"zero latency bound":        metrics.WithLatencyBuckets(0, 1),
		"negative latency bound":    metrics.WithLatencyBuckets(-1, 1),
		"decreasing latency bounds": metrics.WithLatencyBuckets(0.1, 0.01),
		"repeated latency bound":    metrics.WithLatencyBuckets(0.1, 0.1),
		"NaN latency bound":         metrics.WithLatencyBuckets(0.1, math.NaN()),
		"infinite latency bound":    metrics.WithLatencyBuckets(0.1, math.Inf(1)),
		"no wait buckets":           metrics.WithWaitBuckets(),
		"zero wait bound":           metrics.WithWaitBuckets(0),
		"decreasing wait bounds":    metrics.WithWaitBuckets(10, 1),
	} {
		c, err := metrics.New(opt)
		if !errors.Is(err, metrics.ErrInvalidOption) || c != nil {
			t.Errorf("%s: %v, %v; want ErrInvalidOption", name, c, err)
			continue
		}
		if !strings.HasPrefix(err.Error(), "metrics: invalid option: ") {
			t.Errorf("%s: error %q lacks the package prefix", name, err)
		}
	}
}

// TestOptionsApply: the namespace names every series, and the buckets are
// the histograms' own, copied.
func TestOptionsApply(t *testing.T) {
	latency := []float64{0.001, 0.01}
	c, reg := newCollector(t, metrics.WithNamespace("billing_jobs"),
		metrics.WithLatencyBuckets(latency...), metrics.WithWaitBuckets(1, 10))
	latency[0] = 5 // changing the caller's slice changes nothing
	c.ObserveDecision(context.Background(), throttle.Decision{Limiter: "l", Op: throttle.OpAllow, Outcome: throttle.Admitted, Latency: 2 * time.Millisecond})
	o := workermetrics.Observer(c)
	o.Observe(context.Background(), worker.Event{Kind: worker.WaitedInline, TaskType: "t", Delay: 2 * time.Second})
	o.Observe(context.Background(), worker.Event{Kind: worker.LeaseTaken, Rule: "r"})
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	buckets := map[string][]float64{}
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "billing_jobs_") {
			t.Errorf("series %s outside the namespace", f.GetName())
		}
		for _, m := range f.GetMetric() {
			for _, b := range m.GetHistogram().GetBucket() {
				buckets[f.GetName()] = append(buckets[f.GetName()], b.GetUpperBound())
			}
		}
	}
	if len(families) != 7 { // redis errors and deny cache hits at 0
		t.Errorf("%d families, want all 7", len(families))
	}
	for name, want := range map[string][]float64{
		"billing_jobs_decision_duration_seconds": {0.001, 0.01},
		"billing_jobs_worker_wait_seconds":       {1, 10},
	} {
		if got := buckets[name]; !slices.Equal(got, want) {
			t.Errorf("%s buckets %v, want %v", name, got, want)
		}
	}
}

// TestDefaults: the default buckets are valid, fresh on each call, and a
// Collector with no options registers without clashing with the Go
// collector's names.
func TestDefaults(t *testing.T) {
	for name, buckets := range map[string]func() []float64{
		"latency": metrics.DefaultLatencyBuckets,
		"wait":    metrics.DefaultWaitBuckets,
	} {
		b := buckets()
		if _, err := metrics.New(metrics.WithLatencyBuckets(b...)); err != nil {
			t.Errorf("default %s buckets are invalid: %v", name, err)
		}
		b[0] = -1
		if buckets()[0] == -1 {
			t.Errorf("default %s buckets are shared between calls", name)
		}
	}
	c, err := metrics.New()
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), c)
	if err := reg.Register(c); err == nil {
		t.Fatal("registering the same Collector twice succeeded")
	}
}
