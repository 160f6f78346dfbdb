package throttleotel

import (
	"errors"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// The names of the attributes this package sets, on metrics and spans.
const (
	attrLimiter      = attribute.Key("jobthrottle.limiter.name")
	attrOperation    = attribute.Key("jobthrottle.operation")
	attrOutcome      = attribute.Key("jobthrottle.outcome")
	attrPolicy       = attribute.Key("jobthrottle.policy")
	attrPolicySource = attribute.Key("jobthrottle.policy.source")
	attrUnits        = attribute.Key("jobthrottle.units")
	attrRetryAfter   = attribute.Key("jobthrottle.retry_after")
	attrCached       = attribute.Key("jobthrottle.cached")
	attrKey          = attribute.Key("jobthrottle.key")
	attrKeyHash      = attribute.Key("jobthrottle.key.hash")
	attrRule         = attribute.Key("jobthrottle.rule")
	attrTaskType     = attribute.Key("jobthrottle.task.type")
	attrTaskID       = attribute.Key("jobthrottle.task.id")
	attrTaskEvent    = attribute.Key("jobthrottle.task.event")
	attrDelay        = attribute.Key("jobthrottle.delay")
	attrReason       = attribute.Key("jobthrottle.reason")
	attrThrottles    = attribute.Key("jobthrottle.throttles")
	attrAttempt      = attribute.Key("jobthrottle.attempt")
	attrRetrying     = attribute.Key("jobthrottle.retrying")
	attrHTTPEvent    = attribute.Key("jobthrottle.http.event")
	attrStatusCode   = attribute.Key("http.response.status_code")
	attrErrorType    = attribute.Key("error.type")
)

// instruments are the metrics an Instrumentation records.
type instruments struct {
	decisions        metric.Int64Counter     // limiter, operation, outcome, policy source
	policyDecisions  metric.Int64Counter     // limiter, policy
	decisionDuration metric.Float64Histogram // limiter, operation
	waitDuration     metric.Float64Histogram // limiter, outcome
	redisErrors      metric.Int64Counter     // limiter
	denyCacheHits    metric.Int64Counter     // limiter
	leasedDecisions  metric.Int64Counter     // limiter
	tasks            metric.Int64Counter     // task type, rule, event
	taskWait         metric.Float64Histogram // task type, event
	leases           metric.Int64UpDownCounter
}

// latencyBuckets are the bounds, in seconds, of the decision latency
// histogram: 100 µs to 2.5 s, as package metrics has them.
var latencyBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}

// waitBuckets are the bounds, in seconds, of the wait histograms: 10 ms to
// an hour, as package metrics has them.
var waitBuckets = []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}

func newInstruments(m metric.Meter) (instruments, error) {
	var ins instruments
	var errs [10]error
	ins.decisions, errs[0] = m.Int64Counter("jobthrottle.decisions", metric.WithUnit("{decision}"),
		metric.WithDescription("Decisions of jobthrottle limiters by limiter, call (allow, peek, reserve, acquire; share: a renewal of a leased share, admitted when one was granted), outcome (admitted, throttled, error, degraded) and where the policy came from."))
	ins.policyDecisions, errs[1] = m.Int64Counter("jobthrottle.policy.decisions", metric.WithUnit("{decision}"),
		metric.WithDescription("Decisions of jobthrottle rate limiters by limiter and the policy in force that made them, in its short form: a policy change shows as a new series."))
	ins.decisionDuration, errs[2] = m.Float64Histogram("jobthrottle.decision.duration", metric.WithUnit("s"),
		metric.WithDescription("Time jobthrottle limiters took to decide, Redis round trip included, by limiter and call."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...))
	ins.waitDuration, errs[3] = m.Float64Histogram("jobthrottle.wait.duration", metric.WithUnit("s"),
		metric.WithDescription("Time callers of Wait, WaitN and Reservation.Wait slept for their turn, by limiter and outcome (admitted, or error when the context ended first)."),
		metric.WithExplicitBucketBoundaries(waitBuckets...))
	ins.redisErrors, errs[4] = m.Int64Counter("jobthrottle.redis.errors", metric.WithUnit("{error}"),
		metric.WithDescription("Decisions Redis could not make (unreachable, too slow or answering with an error), failed closed or let through degraded, by limiter."))
	ins.denyCacheHits, errs[5] = m.Int64Counter("jobthrottle.deny_cache.hits", metric.WithUnit("{hit}"),
		metric.WithDescription("Rejections answered from a limiter's in-process deny cache without asking Redis, by limiter."))
	ins.leasedDecisions, errs[9] = m.Int64Counter("jobthrottle.leased.decisions", metric.WithUnit("{decision}"),
		metric.WithDescription("Decisions made in the process under its leased share of a key's rate (WithLeasedShares), without Redis, by limiter; also counted in jobthrottle.decisions."))
	ins.tasks, errs[6] = m.Int64Counter("jobthrottle.worker.tasks", metric.WithUnit("{task}"),
		metric.WithDescription("Decisions of jobthrottle's asynq middleware about tasks, by task type, rule and event (admitted, waited_inline, rescheduled, gave_up, degraded, failed, lease_lost, unconfigured)."))
	ins.taskWait, errs[7] = m.Float64Histogram("jobthrottle.worker.wait.duration", metric.WithUnit("s"),
		metric.WithDescription("How long throttled tasks waited in their handler (waited_inline) or were sent away for (rescheduled), by task type and event."),
		metric.WithExplicitBucketBoundaries(waitBuckets...))
	ins.leases, errs[8] = m.Int64UpDownCounter("jobthrottle.worker.lease.active", metric.WithUnit("{lease}"),
		metric.WithDescription("Concurrency leases held by running tasks in this process, by rule."))
	return ins, errors.Join(errs[:]...)
}

// attrCache keeps the attribute sets of the metrics, built once for each
// combination seen, with the option slices that carry them: recording then
// allocates nothing. Its maps are read under a read lock; a combination is
// written once.
type attrCache struct {
	mu        sync.RWMutex
	decisions map[decisionAttrs]*decisionSets
	tasks     map[taskAttrs]*taskSets
	leases    map[string][]metric.AddOption
}

type decisionAttrs struct {
	limiter, op, outcome, source, policy string
}

// decisionSets are the measurement options of one kind of decision.
type decisionSets struct {
	decision, policy, limiter []metric.AddOption
	duration, wait            []metric.RecordOption
}

// adding and recording return an attribute set as the options of Add and
// of Record.
func adding(kvs ...attribute.KeyValue) []metric.AddOption {
	return []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(kvs...))}
}

func recording(kvs ...attribute.KeyValue) []metric.RecordOption {
	return []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(kvs...))}
}

// lookup returns m[k], building it with build on first use.
func lookup[K comparable, V any](c *attrCache, m *map[K]V, k K, build func() V) V {
	c.mu.RLock()
	v, ok := (*m)[k]
	c.mu.RUnlock()
	if ok {
		return v
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if v, ok := (*m)[k]; ok {
		return v
	}
	if *m == nil {
		*m = map[K]V{}
	}
	v = build()
	(*m)[k] = v
	return v
}

func (c *attrCache) decision(k decisionAttrs) *decisionSets {
	return lookup(c, &c.decisions, k, func() *decisionSets {
		limiter := attrLimiter.String(k.limiter)
		return &decisionSets{
			decision: adding(limiter, attrOperation.String(k.op), attrOutcome.String(k.outcome), attrPolicySource.String(k.source)),
			policy:   adding(limiter, attrPolicy.String(k.policy)),
			limiter:  adding(limiter),
			duration: recording(limiter, attrOperation.String(k.op)),
			wait:     recording(limiter, attrOutcome.String(k.outcome)),
		}
	})
}

type taskAttrs struct {
	taskType, rule, event string
}

// taskSets are the measurement options of one kind of task event.
type taskSets struct {
	task []metric.AddOption
	wait []metric.RecordOption
}

func (c *attrCache) task(k taskAttrs) *taskSets {
	return lookup(c, &c.tasks, k, func() *taskSets {
		return &taskSets{
			task: adding(attrTaskType.String(k.taskType), attrRule.String(k.rule), attrTaskEvent.String(k.event)),
			wait: recording(attrTaskType.String(k.taskType), attrTaskEvent.String(k.event)),
		}
	})
}

func (c *attrCache) lease(rule string) []metric.AddOption {
	return lookup(c, &c.leases, rule, func() []metric.AddOption { return adding(attrRule.String(rule)) })
}
