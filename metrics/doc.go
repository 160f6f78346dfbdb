// Package metrics exports what jobthrottle's limiters and asynq middleware
// decide as Prometheus series (github.com/prometheus/client_golang). It is
// the only package of the module, with its subpackage workermetrics, that
// imports client_golang: the core packages report through small observer
// interfaces, and users of another metrics system implement those instead
// of importing this package.
//
// Package metrics itself does not import asynq: a program that uses only
// limiters, or httpthrottle's Transport, pulls in neither asynq nor cron.
// The events of an asynq Throttler reach the same [Collector] through the
// adapter in package workermetrics.
//
// # Wiring
//
// Create one Collector, register it once, and give it to every limiter
// (it is a [throttle.Observer]) and, through workermetrics.Observer, to
// every Throttler whose decisions it should count:
//
//	c, err := metrics.New()
//	if err != nil {
//		return err
//	}
//	prometheus.MustRegister(c) // or reg.MustRegister(c) on your own registry
//
//	partner, _ := throttle.New(rdb, "partner-api", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1},
//		throttle.WithObserver(c))
//	exports, _ := throttle.NewConcurrencyLimiter(rdb, "exports", throttle.Concurrency{Limit: 3, Lease: 30 * time.Second},
//		throttle.WithObserver(c))
//	th, _ := worker.New(rdb, rules, worker.WithObserver(workermetrics.Observer(c)))
//
// The Collector holds the worker series as well as the limiters': nothing
// else is registered. throttle.WithObserver and worker.WithObserver may be
// given more than once: every observer receives every decision or event,
// so a Collector and a dashboard.Publisher can both be fed.
//
// # Series
//
// Names start with the namespace, "jobthrottle" unless changed with
// [WithNamespace]. Limiter series are labelled by the limiter's name, as
// given to throttle.New or throttle.NewConcurrencyLimiter.
//
//	jobthrottle_decisions_total{limiter, op, outcome}          counter
//	    Every call a limiter answered. op is "allow" (Allow, AllowN,
//	    AllowMany, Wait on the window policies), "peek", "reserve"
//	    (Reserve, ReserveFor, Wait on GCRA and TokenBucket) or "acquire"
//	    (ConcurrencyLimiter.Acquire). outcome is "admitted", "throttled"
//	    (rejected by the policy, not an error), "error" (the call returned
//	    an error: bad input, the caller's own context, or Redis unavailable
//	    under fail-closed) or "degraded" (Redis could not answer and
//	    fail-open let the request through). A Peek that would be admitted
//	    counts as admitted.
//	jobthrottle_decision_duration_seconds{limiter, op}          histogram
//	    How long each of those calls took, Redis round trip included.
//	    Answers from the deny cache are in it too, in far less time than a
//	    round trip. Buckets: WithLatencyBuckets.
//	jobthrottle_redis_errors_total{limiter}                     counter
//	    Decisions Redis could not make: unreachable, slower than the
//	    limiter's timeout, or answering with an error. Counted under both
//	    failure policies; bad input and a caller's cancelled context are not
//	    Redis errors. Present at 0 from the limiter's first decision.
//	jobthrottle_deny_cache_hits_total{limiter}                  counter
//	    Rejections answered by the limiter's deny cache
//	    (throttle.WithDenyCache) without a round trip; they are also in
//	    decisions_total as outcome="throttled". Present at 0 from the
//	    limiter's first decision.
//
// Worker series come from a Throttler's gate, through
// workermetrics.Observer, labelled by the asynq task type and the worker
// rule's name (worker.Rate, worker.Concurrency). They exist once a
// Throttler has reported:
//
//	jobthrottle_worker_tasks_total{task_type, rule, event}      counter
//	    One count per decision about a task. event is "admitted" (ran at
//	    once), "waited_inline" (waited in its handler, then ran),
//	    "rescheduled" (sent back to asynq to return later), "gave_up" (a
//	    rule's give-up policy stopped throttling it), "degraded" (Redis
//	    could not decide and a fail-open limiter let it run), "failed"
//	    (the gate could not decide: Redis unavailable under fail-closed, or
//	    a rule found no key), "lease_lost" (a running task's concurrency
//	    lease ran out) or "unconfigured" (a throttled task that asynq
//	    counted as failed, on a server whose Config lacks
//	    Throttler.Configure: alert on any). rule names the rule that made
//	    the task wait (waited_inline: the last one it waited for),
//	    rescheduled it, gave up, failed, lost the lease or throttled it;
//	    it is "" for admitted and degraded, which no one rule decides. A
//	    task that is rescheduled and later runs counts once as rescheduled
//	    and once more when it runs.
//	jobthrottle_worker_wait_seconds{task_type, event}           histogram
//	    The wait of each waited_inline event (time spent in the handler
//	    before running) and rescheduled event (time until the task is due
//	    back in its queue). Buckets: WithWaitBuckets.
//	jobthrottle_worker_leases_held{rule}                        gauge
//	    Concurrency leases held by tasks running in this process: up when
//	    a task takes its lease, down when its handler ends, back to 0 when
//	    the process is idle. The fleet-wide count is the sum over
//	    processes. A degraded lease (fail-open, Redis down) holds no slot
//	    and is not counted.
//
// Tasks throttled are waited_inline plus rescheduled:
//
//	sum by (task_type) (rate(jobthrottle_worker_tasks_total{event=~"waited_inline|rescheduled"}[5m]))
//
// # Bounded labels
//
// No series is labelled by a caller key, a task's key in its rule, or a
// task ID: a million tenants make no more series than one. Label values come
// from names fixed in code: limiter names, ops and outcomes, rule names, and
// asynq task types. The task types are assumed to be bounded by the
// application, as they are when handlers are registered by type; do not
// put tenant or record identifiers in task types. The number of series is
// at most limiters × 5 ops (allow, peek, reserve, acquire, share) × 4
// outcomes for decisions_total, and task types × (rules + 1) × 8 events for
// worker_tasks_total. Invalid UTF-8 in a label value is replaced with
// U+FFFD rather than refused.
//
// # How failures look
//
// Redis down or too slow, under fail-closed (the default): decisions_total
// rises with outcome="error" and redis_errors_total rises by the same
// amount, for every op; a Throttler's gate reports
// event="failed" for the rule whose limiter could not decide, and the task
// goes back to asynq to ask again about five seconds later (it also counts
// as rescheduled, with its rule).
//
// Redis down under fail-open (throttle.WithFailurePolicy(throttle.FailOpen)):
// decisions_total rises with outcome="degraded" and redis_errors_total rises
// with it; Peek ignores the failure policy, so peeks count as "error". The
// gate reports event="degraded" and the task runs; a degraded lease is not
// counted in worker_leases_held.
//
// An alert on either:
//
//	sum by (limiter) (rate(jobthrottle_redis_errors_total[5m])) > 0
//
// outcome="error" without redis_errors_total rising means callers' bad
// input (an empty key, more units than the policy allows) or contexts that
// ended before their decision.
package metrics
