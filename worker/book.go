package worker

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/gate"
)

// Booking is when a booked task may start.
type Booking struct {
	// StartAt is the latest of the task's slots on this process's clock
	// (now, for a task no booking rule matches): its ProcessAt.
	StartAt time.Time
	// Slot is that instant on the Redis server's clock, exact: the slots of
	// tasks booked one after another on one rule are exactly one emission
	// interval apart. Zero for a task no booking rule matches.
	Slot time.Time
}

// Book reserves ahead of time the slot a task will need on the first
// TokenBucket or GCRA rule that matches it, ticketed by id, the asynq task
// ID the task must be enqueued with. It returns when the task may start:
// its slot, which starts no sooner than Lead from now. Enqueued with
// asynq.TaskID(id) and due then, the task finds its slot when it reaches a
// worker (up to Lead after it, as asynq delivers in whole seconds) and runs
// on arrival: this is how a batch is paced instead of being throttled task
// by task. Booking again with the same id before then returns the same
// slot. The task's other rules are decided when it runs, as usual. A
// meter keeps one instant per key, so the capacity before the slot goes
// unused.
//
// maxDelay bounds how far ahead a slot may be booked; a task that would
// start later books nothing and Book fails with an error wrapping
// ErrThrottled. Errors of the limiters are returned as they are.
//
// A task under several TokenBucket or GCRA rules, or under one that shares
// its limit fairly (FairBy) or whose limiter is named, books nothing: its turn is decided among the
// tasks waiting for those rules when it runs, in their shared order (see
// the package documentation), which paces it. Book returns now for it, so
// such a batch is enqueued at once and waits there.
//
// opts are the options the task will be enqueued with: rules that match or
// key by queue (Queue, ByQueue) see the queue of its asynq.Queue option.
func (t *Throttler) Book(ctx context.Context, at *asynq.Task, id string, maxDelay time.Duration, opts ...asynq.Option) (Booking, error) {
	ctx = withQueueOf(ctx, opts)
	rules := t.matching(ctx, at)
	if slices.Contains(meterRoles(rules), roomMeter) {
		return Booking{StartAt: time.Now()}, nil
	}
	for _, r := range rules {
		if r.limiter == nil || !gate.Meter(r.limiter) {
			continue
		}
		key, err := r.key(ctx, at)
		if err == nil && key == "" {
			err = fmt.Errorf("%w: empty key", ErrNoKey)
		}
		if err != nil {
			return Booking{}, fmt.Errorf("worker: rule %q: %w", r.name, err)
		}
		// The task needs the lead to travel through asynq to a worker: its
		// slot starts no sooner, and stays claimable that long after its
		// start in case asynq hands it over late.
		ticket := gate.Ticket{ID: ticketID(id, 0), Grace: t.lead(), NotBefore: t.lead()}
		cost, err := r.costOf(ctx, at)
		if err != nil {
			return Booking{}, fmt.Errorf("worker: rule %q: task cost: %w", r.name, err)
		}
		res, err := gate.ReserveFor(ctx, r.limiter, key, ticket, cost, maxDelay)
		if err != nil {
			return Booking{}, err
		}
		if !res.OK {
			return Booking{}, &ThrottledError{Rule: r.name, Key: key, RetryAfter: res.RetryAfter, until: time.Now().Add(res.RetryAfter)}
		}
		return Booking{StartAt: res.StartAt, Slot: res.Slot}, nil
	}
	return Booking{StartAt: time.Now()}, nil
}
