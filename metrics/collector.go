package metrics

import (
	"fmt"
	"sync"

	"github.com/jobthrottle/jobthrottle/metrics/internal/series"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/prometheus/client_golang/prometheus"
)

// Collector turns the decisions of throttle's limiters, and the events of
// worker's Throttlers, into Prometheus series. It is a [prometheus.Collector]
// (register it with a registry) and a [throttle.Observer] (give it to
// throttle.New with throttle.WithObserver). A Throttler reports to it
// through the adapter of package workermetrics:
// worker.WithObserver(workermetrics.Observer(c)). One Collector may observe
// any number of limiters and Throttlers, and holds every series of both:
// register it once.
//
// A Collector is safe for concurrent use: its observer methods take a few
// hundred nanoseconds on the caller's goroutine and never block on Redis or
// on a scrape. The zero Collector is not usable: call [New].
type Collector struct {
	decisions   *prometheus.CounterVec   // limiter, op, outcome
	policies    *prometheus.CounterVec   // limiter, policy
	latency     *prometheus.HistogramVec // limiter, op
	redisErrors *prometheus.CounterVec   // limiter
	denyHits    *prometheus.CounterVec   // limiter
	leased      *prometheus.CounterVec   // limiter
	// worker holds the worker series, fed by package workermetrics.
	worker *series.Worker

	// limiters holds, by limiter name, the per-limiter counters created at
	// zero on the limiter's first decision (*limiterSeries).
	limiters sync.Map
}

// limiterSeries are the counters of one limiter that exist, at zero, from
// its first decision on, so that a rate over them sees their first rise.
type limiterSeries struct {
	redisErrors prometheus.Counter
	denyHits    prometheus.Counter
}

var (
	_ prometheus.Collector = (*Collector)(nil)
	_ throttle.Observer    = (*Collector)(nil)
)

func init() {
	series.WorkerOf = func(collector any) *series.Worker {
		if c, ok := collector.(*Collector); ok && c != nil {
			return c.worker
		}
		return nil
	}
}

// New returns a Collector with no series yet; series appear as decisions and
// events arrive. Register it with a registry: reg.MustRegister(c), or
// reg.Register(c) to handle a clash of names.
//
// Options and their defaults:
//
//	WithNamespace(s)          "jobthrottle"               prefix of every series name
//	WithLatencyBuckets(b...)  DefaultLatencyBuckets()     decision latency buckets, 100µs to 2.5s
//	WithWaitBuckets(b...)     DefaultWaitBuckets()        worker wait buckets, 10ms to 1h
//
// Errors wrap [ErrInvalidOption].
func New(opts ...Option) (*Collector, error) {
	cfg := defaultConfig()
	for i, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("%w: option %d is nil", ErrInvalidOption, i)
		}
		if err := opt.apply(&cfg); err != nil {
			return nil, err
		}
	}
	ns := cfg.namespace
	return &Collector{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "decisions_total",
			Help: "Decisions of jobthrottle limiters by limiter name, call (allow, peek, reserve, acquire; share: a renewal of a leased share, admitted when one was granted) and outcome (admitted, throttled, error, degraded).",
		}, []string{"limiter", "op", "outcome"}),
		policies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "policy_decisions_total",
			Help: "Decisions of jobthrottle rate limiters by limiter name and the policy in force that made them (the limiter's own, a plan, or one stored with throttlectl set), in its short form: a policy change shows as a new series, a rollout as two.",
		}, []string{"limiter", "policy"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Name: "decision_duration_seconds",
			Help:    "Time jobthrottle limiters took to decide, Redis round trip included, by limiter name and call.",
			Buckets: cfg.latencyBuckets,
		}, []string{"limiter", "op"}),
		redisErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "redis_errors_total",
			Help: "Decisions Redis could not make (unreachable, too slow or answering with an error), failed closed or let through degraded, by limiter name.",
		}, []string{"limiter"}),
		denyHits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "deny_cache_hits_total",
			Help: "Rejections answered from the limiter's in-process deny cache without asking Redis, by limiter name.",
		}, []string{"limiter"}),
		leased: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "leased_decisions_total",
			Help: "Decisions made in the process under its leased share of a key's rate (WithLeasedShares), without Redis, by limiter name; also counted in decisions_total.",
		}, []string{"limiter"}),
		worker: &series.Worker{
			Tasks: prometheus.NewCounterVec(prometheus.CounterOpts{
				Namespace: ns, Name: "worker_tasks_total",
				Help: "Decisions of jobthrottle's asynq middleware about tasks, by task type, rule and event (admitted, waited_inline, rescheduled, gave_up, degraded, failed, lease_lost, unconfigured).",
			}, []string{"task_type", "rule", "event"}),
			Waits: prometheus.NewHistogramVec(prometheus.HistogramOpts{
				Namespace: ns, Name: "worker_wait_seconds",
				Help:    "How long throttled tasks waited in their handler (waited_inline) or were sent away for (rescheduled), by task type and event.",
				Buckets: cfg.waitBuckets,
			}, []string{"task_type", "event"}),
			Leases: prometheus.NewGaugeVec(prometheus.GaugeOpts{
				Namespace: ns, Name: "worker_leases_held",
				Help: "Concurrency leases held by running tasks in this process, by rule.",
			}, []string{"rule"}),
		},
	}, nil
}

// vectors returns every metric vector of the Collector.
func (c *Collector) vectors() [9]prometheus.Collector {
	return [...]prometheus.Collector{c.decisions, c.policies, c.latency, c.redisErrors, c.denyHits, c.leased,
		c.worker.Tasks, c.worker.Waits, c.worker.Leases}
}

// Describe sends the descriptors of every series the Collector can export;
// part of [prometheus.Collector].
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, v := range c.vectors() {
		v.Describe(ch)
	}
}

// Collect sends the current value of every series; part of
// [prometheus.Collector].
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, v := range c.vectors() {
		v.Collect(ch)
	}
}

// limiter returns the per-limiter counters of the limiter named name,
// creating them at zero on its first decision.
func (c *Collector) limiter(name string) *limiterSeries {
	if s, ok := c.limiters.Load(name); ok {
		return s.(*limiterSeries)
	}
	s, _ := c.limiters.LoadOrStore(name, &limiterSeries{
		redisErrors: c.redisErrors.WithLabelValues(name),
		denyHits:    c.denyHits.WithLabelValues(name),
	})
	return s.(*limiterSeries)
}
