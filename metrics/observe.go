package metrics

import (
	"context"

	"github.com/jobthrottle/jobthrottle/metrics/internal/series"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// ObserveDecision counts one decision of a limiter: in decisions_total by
// limiter, op and outcome, in decision_duration_seconds, in
// redis_errors_total when Redis could not decide ([throttle.Decision.RedisFailed])
// in deny_cache_hits_total when the deny cache answered, and in
// leased_decisions_total when it was made under a leased share. The caller key
// is never used, and the sleeps of Wait ([throttle.OpWait]) are not
// decisions: they are left out. It makes [Collector] a [throttle.Observer];
// it is safe for concurrent use.
func (c *Collector) ObserveDecision(_ context.Context, d throttle.Decision) {
	if d.Op == throttle.OpWait {
		return
	}
	limiter := series.LabelValue(d.Limiter)
	op := series.LabelValue(string(d.Op))
	own := c.limiter(limiter)
	c.decisions.WithLabelValues(limiter, op, d.Outcome.String()).Inc()
	if d.Policy != "" && d.Op != throttle.OpAcquire { // rate limiters only: a cap's policy never changes
		c.policies.WithLabelValues(limiter, series.LabelValue(d.Policy)).Inc()
	}
	c.latency.WithLabelValues(limiter, op).Observe(d.Latency.Seconds())
	if d.RedisFailed() {
		own.redisErrors.Inc()
	}
	if d.Cached {
		own.denyHits.Inc()
	}
	if d.Leased {
		c.leased.WithLabelValues(limiter).Inc()
	}
}
