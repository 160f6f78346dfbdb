package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/throttle"
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

// Book reserves ahead of time the slots a task will need on the TokenBucket
// and GCRA rules that match it, ticketed by id, the asynq task ID the task
// must be enqueued with. It returns when the task may start: the latest of
// its slots, which start no sooner than Lead from now. Enqueued with
// asynq.TaskID(id) and due then, the task finds its slots
// when it reaches a worker (up to a forwarder pass after start, as asynq
// delivers in whole seconds) and runs on arrival: this is how a batch is
// paced instead of being throttled task by task. Booking again with the
// same id before then returns the same slots. Rules of other kinds are
// checked when the task runs, as usual.
//
// maxDelay bounds how far ahead a slot may be booked; a task that would
// start later books nothing and Book fails with an error wrapping
// ErrThrottled. Errors of the limiters are returned as they are.
func (t *Throttler) Book(ctx context.Context, at *asynq.Task, id string, maxDelay time.Duration) (Booking, error) {
	rules := t.matching(at)
	// The task needs the lead to travel through asynq to a worker: its slot
	// starts no sooner, and stays claimable that long after its start in
	// case asynq hands it over late.
	ticket := throttle.Ticket{ID: ticketID(id, 0), Grace: t.lead(), NotBefore: t.lead()}
	var booked []booking
	var latest *booking
	cancelBooked := func() {
		p := pass{bookings: booked}
		p.giveBack(ctx, 0)
	}
	for _, r := range rules {
		if r.limiter == nil || !r.limiter.CanReserveAhead() {
			continue
		}
		key, err := r.key(at)
		if err == nil && key == "" {
			err = fmt.Errorf("%w: empty key", ErrNoKey)
		}
		if err != nil {
			cancelBooked()
			return Booking{}, fmt.Errorf("worker: rule %q: %w", r.name, err)
		}
		res, err := r.limiter.ReserveFor(ctx, key, ticket, 1, maxDelay)
		if err != nil {
			cancelBooked()
			return Booking{}, err
		}
		if !res.OK {
			cancelBooked()
			return Booking{}, &ThrottledError{Rule: r.name, Key: key, RetryAfter: res.RetryAfter, until: time.Now().Add(res.RetryAfter)}
		}
		booked = append(booked, booking{res, r, key})
		if latest == nil || res.Delay > latest.Delay {
			latest = &booked[len(booked)-1]
		}
	}
	if latest == nil {
		return Booking{StartAt: time.Now()}, nil
	}
	return Booking{StartAt: latest.StartAt, Slot: latest.Slot}, nil
}
