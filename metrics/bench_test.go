package metrics_test

import (
	"context"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/metrics/workermetrics"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
)

// BenchmarkObserveDecision is the cost a Collector adds to each decision,
// on the caller's goroutine.
func BenchmarkObserveDecision(b *testing.B) {
	c, _ := newCollector(b)
	d := throttle.Decision{Limiter: "partner-api", Op: throttle.OpAllow, Key: "tenant-42", N: 1,
		Outcome: throttle.Admitted, Latency: 300 * time.Microsecond}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c.ObserveDecision(context.Background(), d)
		}
	})
}

// BenchmarkObserveEvent is the cost a Collector adds to each worker event,
// through workermetrics.Observer.
func BenchmarkObserveEvent(b *testing.B) {
	c, _ := newCollector(b)
	o := workermetrics.Observer(c)
	e := worker.Event{Kind: worker.WaitedInline, TaskID: "id", TaskType: "partner:sync", Key: "tenant-42", Delay: 120 * time.Millisecond}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			o.Observe(context.Background(), e)
		}
	})
}
