package worker

import (
	"context"
	"time"
)

// EventKind says what happened to a task at the gate.
type EventKind int

const (
	// Admitted: the task's rules let it run at once.
	Admitted EventKind = iota
	// WaitedInline: the task waited Delay in its handler, then ran.
	WaitedInline
	// Rescheduled: the task went back to asynq, to return after Delay.
	Rescheduled
	// GaveUp: a rule's give-up policy stopped throttling the task.
	GaveUp
	// Degraded: Redis could not decide and a fail-open limiter let the
	// task through.
	Degraded
	// Failed: the gate could not decide. With Redis unavailable (under
	// fail-closed) the task is not failed: it waits and asks again, inline
	// or back in asynq (a Rescheduled event follows). With no key for a
	// rule, the task fails with asynq.SkipRetry and is archived: retrying
	// cannot give it a key.
	Failed
	// LeaseTaken: the task holds a concurrency lease of Rule while its
	// handler runs. Each is followed by a LeaseReleased when the handler
	// ends: the pair keeps a gauge of leases held.
	LeaseTaken
	// LeaseReleased: the task's handler ended and its lease of Rule was
	// given back.
	LeaseReleased
	// LeaseLost: the task's lease of Rule was lost while its handler ran
	// (it ran out unrenewed, Redis being unreachable for a whole lease, or
	// its key was reset), so another task may hold the slot. The handler's
	// context is cancelled with a cause wrapping throttle.ErrLeaseLost, and
	// a task whose handler then fails goes back to asynq as throttled (a
	// Rescheduled event follows), not as failed. LeaseReleased still
	// follows when the handler ends.
	LeaseLost
	// Unconfigured: the task was sent back with a *ThrottledError on an
	// asynq server whose Config lacks the functions of
	// [Throttler.Configure], and asynq counted it as a failure: it used up
	// one of its retries and returns on asynq's own retry schedule, not at
	// its slot. Reported for each such task once asynq has recorded it;
	// the Throttler's first also logs one Error naming the fix. Rule and
	// Key are the throttle's.
	Unconfigured
)

var kindNames = [...]string{Admitted: "admitted", WaitedInline: "waited_inline", Rescheduled: "rescheduled",
	GaveUp: "gave_up", Degraded: "degraded", Failed: "failed", LeaseTaken: "lease_taken",
	LeaseReleased: "lease_released", LeaseLost: "lease_lost", Unconfigured: "unconfigured"}

// String names the kind, for logs and metric labels.
func (k EventKind) String() string {
	if k < 0 || int(k) >= len(kindNames) {
		return "unknown"
	}
	return kindNames[k]
}

// Event describes one decision about one task.
type Event struct {
	Kind     EventKind
	TaskID   string
	TaskType string
	// Rule and Key name the rule that made the task wait (WaitedInline: the
	// last one it waited for), rescheduled it, gave up, failed, holds the
	// lease or throttled it (Unconfigured), and the task's key in it; empty
	// for Admitted and Degraded.
	Rule, Key string
	// Limiter is the name of Rule's limiter (throttle's Limiter.Name), the
	// name its decisions carry; empty when Rule is.
	Limiter string
	// Delay is the inline wait (WaitedInline) or the time until the task
	// returns (Rescheduled).
	Delay time.Duration
	// Throttles counts the task's throttles by Rule, where the rule has a
	// give-up policy that counts them.
	Throttles int
	// Err is the cause of Failed and Degraded.
	Err error
	// Slot is when the task's turn came, on the Redis server's clock, for
	// Admitted and WaitedInline: the start of the latest slot its rate
	// rules gave it (for a task that claimed a slot booked earlier, that
	// slot, even if the task arrived after it). Compare Slots with each
	// other, not with this process's clock. Zero for a task under
	// concurrency caps only, and for other events.
	Slot time.Time
}

// Observer receives the gate's events. Observe is called synchronously on
// the task's goroutine, with the context asynq gave the task's handler (a
// tracer finds the handler's span in it), so it must be quick and safe for
// concurrent use. Events that happen outside a handler (Unconfigured, and a
// Rescheduled or Failed after the handler returned) come with the
// handler's context when there was one, else context.Background().
type Observer interface {
	Observe(context.Context, Event)
}

// ObserverFunc adapts a function to an Observer.
type ObserverFunc func(context.Context, Event)

// Observe calls f.
func (f ObserverFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }
