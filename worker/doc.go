// Package worker throttles asynq task handlers (github.com/hibiken/asynq)
// with fleet-wide rules kept in Redis by package throttle.
//
// Build a [Throttler] from rules, install its middleware, and let it set up
// the server's Config:
//
//	perTenant, _ := throttle.New(rdb, throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1})
//	exports, _ := throttle.NewConcurrencyLimiter(rdb, throttle.Concurrency{Limit: 3, Lease: 30 * time.Second})
//	t, err := worker.New(rdb, []worker.Rule{
//		worker.Rate("tenant", worker.Pattern("partner:*"), perTenant, worker.KeyBy(worker.ByPayloadField("tenant_id"))),
//		worker.Concurrency("exports", worker.Type("export:run"), exports),
//	})
//	cfg := asynq.Config{Concurrency: 10}
//	t.Configure(&cfg) // RetryDelayFunc, IsFailure and asynq's polling intervals
//	srv := asynq.NewServerFromRedisClient(rdb, cfg)
//	mux := asynq.NewServeMux()
//	mux.Use(t.Middleware)
//
// # How a throttled task travels
//
// Before a task runs, every rule that matches it is asked, concurrency caps
// first, then rate rules. A rejection by one rule gives back what the
// others took. Then:
//
//   - A task that may run within the inline wait (1 s by default; for a
//     booked slot, at least the time a return through asynq takes) waits in
//     its handler and runs. asynq cannot bring a task back sooner than about
//     a second, so short waits are cheapest inline.
//   - On a TokenBucket or GCRA rule, a task whose turn is further off books
//     its slot (throttle's ReserveFor, ticketed by task ID) and goes back to
//     asynq to return a little before it: a second for the whole-second retry
//     times asynq stores, one pass of its forwarder (DelayedTaskCheckInterval,
//     which Configure sets to 250 ms) and an idle worker's longest sleep
//     between looks at its queues (1.5 × TaskCheckInterval, which Configure
//     sets to 100 ms): 1.4 s with those settings. Back early, it finds its
//     slot and waits inline for it.
//     Rescheduled tasks thus return one by one at the rate, each admitted on
//     arrival, instead of all at the same second to be rejected again.
//   - On other rules, a task goes back for the limiter's RetryAfter, rounded
//     up to the whole second, plus a random spread of up to as much again.
//
// A task goes back by returning a *ThrottledError. The functions
// [Throttler.Configure] installs turn it into a retry at exactly its time,
// and tell asynq it is not a failure: it is not counted as failed and does
// not use up a retry.
//
// asynq archives a task whose retries are used up (or that was enqueued
// with MaxRetry(0)) before it asks IsFailure. So a task with no retries left
// never goes back: it waits inline as long as its deadline allows, and if
// even that is too short, the Throttler enqueues a copy of it to run at its
// slot and ends the task without error. The copy keeps the payload, the
// headers, the queue and the task's bookings; its ID is the original's plus
// "~1" (then "~2"...), and [OriginalTaskID] gives the original's ID to the
// handler. Nothing is archived or dropped because of throttling.
//
// A handler may return a *ThrottledError of its own, when a limit it
// learns of itself (a partner's 429) says to come back later: it travels
// the same way, RetryAfter (at least a second) counting from its return,
// and a task with no retries left is handed over rather than archived.
//
// # Concurrency caps
//
// A [Concurrency] rule takes a lease before the handler runs and releases
// it when the handler returns, however it returns. If the lease is lost
// while the handler runs (Redis unreachable for a whole lease, or its key
// reset), another task may take the slot: the handler's context is then
// cancelled with a cause wrapping throttle.ErrLeaseLost (see
// context.Cause), the Observer sees a LeaseLost event, and a task whose
// handler then returns an error goes back to asynq as throttled, not as
// failed. Handlers that hold a cap should watch their context.
//
// # Giving up
//
// A rule may stop throttling a task after a number of throttles or a
// length of time ([GiveUp]), counted in Redis by task ID; the task is then
// archived with a *GaveUpError, or dropped.
//
// # Failures of Redis
//
// When a rule's limiter cannot reach Redis and fails closed, the task is
// not failed: it goes back as throttled, to try again in about five
// seconds. A fail-open limiter lets it through, and the Observer sees a
// Degraded event.
//
// asynq records a task's outcome in Redis once, when the handler returns;
// if Redis is down at that moment the record is lost, and asynq runs the
// task again after its lease, or archives it if it had no retries left.
// So the middleware waits, before it returns, until Redis answers
// ([WithSettle], on by default, at most 30 s). The client given to [New]
// must be asynq's Redis.
package worker
