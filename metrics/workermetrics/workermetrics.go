// Package workermetrics counts the events of jobthrottle's asynq
// middleware (package worker) in a [metrics.Collector]. It is kept apart
// from package metrics so that metrics, for limiters and HTTP clients,
// does not import asynq.
//
// The worker series belong to the Collector: register the Collector once,
// and give its adapter to the Throttler:
//
//	c, err := metrics.New()
//	if err != nil {
//		return err
//	}
//	prometheus.MustRegister(c)
//	limiter, _ := throttle.New(rdb, "partner-api", policy, throttle.WithObserver(c))
//	th, _ := worker.New(rdb, rules, worker.WithObserver(workermetrics.Observer(c)))
//
// The series (jobthrottle_worker_tasks_total, jobthrottle_worker_wait_seconds
// and jobthrottle_worker_leases_held) are described in package metrics.
package workermetrics

import (
	"context"

	"github.com/jobthrottle/jobthrottle/metrics"
	"github.com/jobthrottle/jobthrottle/metrics/internal/series"
	"github.com/jobthrottle/jobthrottle/worker"
)

// Observer returns a [worker.Observer] that counts a Throttler's events in
// c's worker series: LeaseTaken and LeaseReleased move
// worker_leases_held of the event's rule up and down; every other kind
// counts in worker_tasks_total by task type, rule and event, and
// WaitedInline and Rescheduled also put their Delay in
// worker_wait_seconds. The task's ID and key are never used.
//
// The Observer is safe for concurrent use and takes a few hundred
// nanoseconds on the task's goroutine. Any number of Throttlers may share
// one, or each have their own for the same c. It returns nil for a nil c,
// which worker.WithObserver refuses.
func Observer(c *metrics.Collector) worker.Observer {
	s := series.WorkerOf(c)
	if s == nil {
		return nil
	}
	return observer{s}
}

// observer feeds one Collector's worker series.
type observer struct{ series *series.Worker }

// Observe counts e.
func (o observer) Observe(_ context.Context, e worker.Event) {
	rule := series.LabelValue(e.Rule)
	switch e.Kind {
	case worker.LeaseTaken:
		o.series.Leases.WithLabelValues(rule).Inc()
		return
	case worker.LeaseReleased:
		o.series.Leases.WithLabelValues(rule).Dec()
		return
	}
	taskType := series.LabelValue(e.TaskType)
	event := e.Kind.String()
	o.series.Tasks.WithLabelValues(taskType, rule, event).Inc()
	if e.Kind == worker.WaitedInline || e.Kind == worker.Rescheduled {
		o.series.Waits.WithLabelValues(taskType, event).Observe(e.Delay.Seconds())
	}
}
