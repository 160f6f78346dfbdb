package throttle

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Reservation is a slot booked on a [TokenBucket] or [GCRA] limiter by
// [Limiter.Reserve]: the caller may start its n units at StartAt, and the
// capacity is already taken, so starting needs no further call to Redis.
// A Reservation's methods are safe for concurrent use.
type Reservation struct {
	// OK reports whether the slot was booked. When false nothing was taken
	// and RetryAfter says how long until a reservation with the same
	// longest delay would succeed.
	OK bool

	// Delay is how long after the decision the slot starts: 0 to start now.
	Delay time.Duration

	// StartAt is when the caller may start, on this process's clock: the
	// moment the reply arrived plus Delay, so never earlier than Redis
	// allows. Zero when not OK.
	StartAt time.Time

	// RetryAfter is 0 when OK; otherwise how far the needed delay exceeds
	// the longest delay the caller accepted.
	RetryAfter time.Duration

	// Limit is the policy's Burst, Remaining the units still free now.
	Limit, Remaining int

	// Degraded reports a reservation granted without Redis under
	// [FailOpen]: OK with no delay, and nothing to cancel.
	Degraded bool

	limiter *Limiter
	key     string
	n       int
	// endMicros and endTicks are the instant, on the Redis clock, up to
	// which the meter's capacity was spoken for right after this booking.
	endMicros, endTicks int64
	// serverStart is the slot's start on the Redis clock, in µs.
	serverStart int64

	mu        sync.Mutex
	cancelled bool
}

// maxReserveDelay is the longest delay Reserve books, whatever is asked.
const maxReserveDelay = maxSpan

// Reserve books n units for key at the earliest slot the policy allows, as
// long as that slot starts within maxDelay; otherwise it books nothing and
// reports how much longer the wait is. Callers that reserve one after
// another get distinct start times spaced by the policy's rate (t, t+1/r,
// t+2/r, ... once the burst is spent), so each one, arriving at its start
// time, finds the capacity it booked: no thundering herd of retries.
//
// Reserve is offered by [TokenBucket] and [GCRA], whose state can go into
// debt up to maxDelay; other policies return [ErrNotSupported]. A negative
// maxDelay fails with [ErrInvalidDelay]. When Redis cannot answer, the
// failure policy decides: [FailOpen] grants a Degraded reservation at once.
func (l *Limiter) Reserve(ctx context.Context, key string, n int, maxDelay time.Duration) (*Reservation, error) {
	if !l.spec.reservable {
		return nil, fmt.Errorf("%w: %T cannot book future slots; use GCRA or TokenBucket", ErrNotSupported, l.policy)
	}
	if err := validRequest(key, n, l.spec.capacity); err != nil {
		return nil, err
	}
	if maxDelay < 0 {
		return nil, fmt.Errorf("%w: the longest delay must not be negative, got %s", ErrInvalidDelay, maxDelay)
	}
	reply, err := l.run(ctx, modeReserve, key, n, itoa(l.ticks(maxDelay)))
	if err != nil {
		if l.failOpen(ctx) {
			return &Reservation{OK: true, StartAt: time.Now(), Limit: l.spec.capacity, Degraded: true}, nil
		}
		return nil, l.unavailable(ctx, err)
	}
	received := time.Now()
	r := resultOf(reply, l.spec.capacity)
	res := &Reservation{OK: r.Allowed, Limit: r.Limit, Remaining: r.Remaining, limiter: l, key: key, n: n}
	if !res.OK {
		res.RetryAfter = r.RetryAfter
		return res, nil
	}
	res.Delay, res.StartAt = r.RetryAfter, received.Add(r.RetryAfter)
	res.endMicros, res.endTicks = reply[5], reply[6]
	res.serverStart = r.serverTime + reply[2]
	return res, nil
}

// ticks converts a delay to the policy's ticks (1/den µs), no longer than
// maxReserveDelay and small enough to keep the script's sums exact.
func (l *Limiter) ticks(d time.Duration) int64 {
	us := min(d, maxReserveDelay).Microseconds()
	if us > maxExact/l.spec.den {
		return maxExact
	}
	return us * l.spec.den
}

// Cancel gives the reservation's capacity back, as far as that is still
// possible: nothing once its slot has started, and only the part no later
// reservation has been booked behind, so that no other caller's slot moves.
// Cancelling twice, or cancelling a reservation that was not OK, does
// nothing.
func (r *Reservation) Cancel(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.OK || r.Degraded || r.cancelled {
		return nil
	}
	_, err := r.limiter.run(ctx, modeCancel, r.key, r.n, itoa(r.endMicros), itoa(r.endTicks))
	if err != nil {
		return r.limiter.unavailable(ctx, err)
	}
	r.cancelled = true
	return nil
}

// Wait sleeps until StartAt. If ctx ends first, or its deadline falls
// before StartAt, Wait cancels the reservation and returns an error
// wrapping the context's error (context.DeadlineExceeded for a deadline
// that is too near).
func (r *Reservation) Wait(ctx context.Context) error {
	if !r.OK {
		return fmt.Errorf("%w: %q needs %s longer than the reservation allowed", ErrNotReserved, r.key, r.RetryAfter)
	}
	wait := time.Until(r.StartAt)
	if wait <= 0 {
		return nil
	}
	if deadline, ok := ctx.Deadline(); ok && deadline.Before(r.StartAt) {
		r.cancelDetached(ctx)
		return fmt.Errorf("throttle: slot for %q starts %s after the context's deadline: %w",
			r.key, r.StartAt.Sub(deadline), context.DeadlineExceeded)
	}
	if err := sleep(ctx, wait); err != nil {
		r.cancelDetached(ctx)
		return err
	}
	return nil
}

// cancelDetached cancels on behalf of a caller whose context is ending:
// the cancellation itself must not be cut short by that context.
func (r *Reservation) cancelDetached(ctx context.Context) {
	_ = r.Cancel(context.WithoutCancel(ctx))
}

// sleep waits for d or until ctx is done, whichever comes first, and then
// returns the context's error, wrapped.
func sleep(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("throttle: wait abandoned: %w", ctx.Err())
	}
}
