package metrics

import (
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
)

// ObserveDecision counts one decision of a limiter: in decisions_total by
// limiter, op and outcome, in decision_duration_seconds, in
// redis_errors_total when Redis could not decide ([throttle.Decision.RedisFailed])
// and in deny_cache_hits_total when the deny cache answered. The caller key
// is never used. It makes [Collector] a [throttle.Observer]; it is safe for
// concurrent use.
func (c *Collector) ObserveDecision(d throttle.Decision) {
	limiter := labelValue(d.Limiter)
	op := labelValue(string(d.Op))
	series := c.limiter(limiter)
	c.decisions.WithLabelValues(limiter, op, d.Outcome.String()).Inc()
	if d.Policy != "" {
		c.policies.WithLabelValues(limiter, labelValue(d.Policy)).Inc()
	}
	c.latency.WithLabelValues(limiter, op).Observe(d.Latency.Seconds())
	if d.RedisFailed() {
		series.redisErrors.Inc()
	}
	if d.Cached {
		series.denyHits.Inc()
	}
}

// Observe counts one event of a worker's gate: LeaseTaken and LeaseReleased
// move worker_leases_held of the event's rule up and down; every other kind
// counts in worker_tasks_total by task type, rule and event, and
// WaitedInline and Rescheduled also put their Delay in worker_wait_seconds.
// The task's ID and key are never used. It makes [Collector] a
// [worker.Observer]; it is safe for concurrent use.
func (c *Collector) Observe(e worker.Event) {
	rule := labelValue(e.Rule)
	switch e.Kind {
	case worker.LeaseTaken:
		c.leases.WithLabelValues(rule).Inc()
		return
	case worker.LeaseReleased:
		c.leases.WithLabelValues(rule).Dec()
		return
	}
	taskType := labelValue(e.TaskType)
	event := e.Kind.String()
	c.tasks.WithLabelValues(taskType, rule, event).Inc()
	if e.Kind == worker.WaitedInline || e.Kind == worker.Rescheduled {
		c.waits.WithLabelValues(taskType, event).Observe(e.Delay.Seconds())
	}
}
