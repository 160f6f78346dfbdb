// Package worker throttles asynq task handlers (github.com/hibiken/asynq)
// with fleet-wide rules kept in Redis by package throttle.
//
// Build a [Throttler] from rules, install its middleware, and let it set up
// the server's Config:
//
//	perTenant, _ := throttle.New(rdb, "partner-per-tenant", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1})
//	exports, _ := throttle.NewConcurrencyLimiter(rdb, "exports", throttle.Concurrency{Limit: 3, Lease: 30 * time.Second})
//	t, err := worker.New(rdb, []worker.Rule{
//		worker.Rate("tenant", worker.Pattern("partner:*"), perTenant, worker.KeyBy(worker.ByPayloadField("tenant_id"))),
//		worker.Concurrency("exports", worker.Type("export:run"), exports, worker.KeyBy(worker.Constant("all"))),
//	})
//	cfg := asynq.Config{Concurrency: 10}
//	t.Configure(&cfg) // RetryDelayFunc, IsFailure and asynq's polling intervals
//	srv := asynq.NewServerFromRedisClient(rdb, cfg)
//	mux := asynq.NewServeMux()
//	mux.Use(t.Middleware)
//	// ... srv.Run(mux); then, once the server has stopped:
//	t.Close(ctx)
//
// # How a throttled task travels
//
// Before a task runs, every rule that matches it is asked, concurrency caps
// first, then windows, then TokenBucket and GCRA rules (the rules that
// space tasks at a rate). A refusal by one rule gives back what the others
// took. A task that may start within the inline wait (1 s by default, and
// at least twice the return lead below) waits in its handler and runs: asynq
// cannot bring a task back sooner than about a second, so short waits are
// cheapest inline. Further off, it goes back to asynq and keeps a place in
// Redis, by its task ID: a booking of its slot, a place in a waiting room,
// or a place in a cap's line. At its turn it is moved to the head of its
// queue, and when it comes back one call claims its place. Which place,
// and what brings it back, depends on the rules (docs/worker.md has this
// on one page, with what each costs):
//
//   - Under one TokenBucket or GCRA rule, the task books its slot (by its
//     task ID, so that it finds the booking when it returns) and goes back
//     to asynq. At its turn, the Throttler's dispatcher moves it to the head
//     of its queue, ahead of any backlog, a little before its slot (the
//     longest an idle worker sleeps between looks at its queues, plus 50
//     ms). It starts at its slot; a task that comes late for it still starts
//     no closer to the tasks before it than the rate allows. On one Redis
//     server, the call that books the slot puts the task in its queue's
//     return lane in Redis, whose one holder in the fleet moves all its due
//     tasks in one call every 100-250 ms.
//   - Under several TokenBucket or GCRA rules (per tenant and overall, say),
//     or one that shares its limit fairly ([FairBy]), or one whose limiter
//     applies live policies (its policy may change while tasks wait:
//     throttle.WithLivePolicies),
//     the task waits in the waiting room of one of them: the FairBy rule,
//     else the live one, or else the second matching one (typically the overall
//     rule). Waiters are let out at the policy in force when their turn
//     comes, so a limit raised live speeds up the backlog already waiting. The dispatcher lets waiters
//     out one by one as that rule's rate allows, in fair order between
//     flows (by default a waiter's flow is its key in the first rule, its
//     tenant, say; [Weights] weighs them), books their slot at the same
//     instant on the task's other rules, and moves the task to the head of
//     its queue. A flow whose own rule has no room is passed over until it
//     has, so what one rule refuses is not taken from the others. A waiter
//     is let out a little before its slot (the time an idle worker takes to
//     look at its queue, and the dispatcher's own recent delays on a busy
//     machine) and never less than that less 50 ms before it. The task
//     starts at its slot if it comes within 50 ms after it; later, it waits
//     in the room again, in its place. A waiter that asks for a turn while
//     others wait in the room stands behind them, so a newcomer tenant's
//     first task waits behind no other tenant's backlog. One dispatcher of
//     the fleet lets a room's waiters out at a time, the one holding the
//     room's lease (renewed by each of its releases, for 5 s); the others
//     take the room over when the lease ends unrenewed, or at once when its
//     holder's Throttler is closed. On one Redis server (on a Cluster,
//     when the rules key the task by the same value) a task's starts on
//     all these rules are one call, which also puts a refused task in the
//     room; and on one Redis server a release lets out up to 16
//     waiters whose slots fall within the lead and 500 ms more, booking
//     their slots on their other rules and moving their tasks in its own
//     call, for the waiters the dispatcher expects (the first in the
//     room's order).
//   - Under a concurrency cap whose slots are all taken, the task stands in
//     the cap's line in Redis, in the order tasks came, and the release
//     that frees a slot hands it to the task, which learns it at once
//     (throttle's AcquireWait). When its
//     inline wait runs out it keeps its place, marked away (the line marks
//     it so when the wait it announced runs out, with no call of its own),
//     and goes back to asynq; a release that frees a slot near its place
//     calls it back to the head of its queue in time to wait for it inline.
//   - Under other rules (windows), the task goes back for the limiter's
//     RetryAfter plus a random spread of up to as much again, so that tasks
//     turned away together do not come back together.
//
// If the process whose dispatcher would bring a task back stops, asynq's own
// retry brings it back later, at the tail of its queue: 2 s after its
// booked slot; 10 s after twice its estimated wait in a room; 10 s after it
// parked in a cap's line. A room's turns are then taken up by whichever
// process the task reaches.
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
// # What rules see, and what tasks cost
//
// Matchers and key functions get the handler's context: [Queue] matches
// and [ByQueue] keys by the task's asynq queue ([QueueOf]). A rate rule may
// count a task as several units ([Cost]), as AllowN does: a task waits
// until its units fit, a waiting room shares units fairly between flows,
// and a task whose cost the policy can never admit fails without retries
// (throttle.ErrExceedsLimit). Plans per tenant are the limiter's
// (throttle.WithPlan, chosen by the rule's key).
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
