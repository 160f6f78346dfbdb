package throttle

import (
	"context"
	"time"
)

// ServerTime returns the Redis clock, in Unix microseconds, at which r was
// decided: tests feed it to the reference models.
func ServerTime(r Result) int64 { return r.serverTime }

// ServerStart returns a booked reservation's start on the Redis clock, in
// Unix microseconds.
func ServerStart(r *Reservation) int64 { return r.serverStart }

// AbandonLease stops a lease's renewals without releasing it: the holder
// "crashes".
func AbandonLease(l *Lease) { l.stopRenewing() }

// ReservationEnd returns where a meter booking left the meter's instant on
// the Redis clock: microseconds and ticks of 1/den µs.
func ReservationEnd(r *Reservation) (micros, ticks int64) { return r.undo[0], r.undo[1] }

// ServerTime0 returns the Redis clock, in Unix microseconds, at which a
// reservation was decided.
func ServerTime0(r *Reservation) int64 { return r.serverTime }

// Queued returns how many decisions wait for a round trip of l's
// coalescer (WithCoalescing).
func Queued(l *Limiter) int {
	l.shared.mu.Lock()
	defer l.shared.mu.Unlock()
	return len(l.shared.pending)
}

// CoalesceLanes is how many round trips a coalescing Limiter sends before
// callers queue.
const CoalesceLanes = coalesceLanes

// LineLen returns how many waiters stand in key's line of c.
func LineLen(ctx context.Context, c *ConcurrencyLimiter, key string) (int, error) {
	n, err := c.client.ZCard(ctx, c.Key(key)+lineSuffix).Result()
	return int(n), err
}

// ForgetPolicyRead makes l's next decision read its stored policies first,
// as it does after liveStale without a read.
func ForgetPolicyRead(l *Limiter) {
	if l.live == nil {
		return
	}
	l.live.mu.Lock()
	defer l.live.mu.Unlock()
	if set := l.live.set.Load(); set != nil {
		stale := *set
		stale.read = time.Time{}
		l.live.set.Store(&stale)
	}
}

// PolicyFreshness is how long after a change a limiter's decisions follow
// a stored policy at most.
const PolicyFreshness = liveStale

// Ticket is the worker's ticket of a booking, for the tests of reserveFor.
type Ticket = ticket

// ReserveFor is reserveFor, which the worker reaches through gate.
func (l *Limiter) ReserveFor(ctx context.Context, key string, t Ticket, n int, maxDelay time.Duration) (*Reservation, error) {
	return l.reserveFor(ctx, key, t, n, maxDelay)
}

// Slot returns a booked reservation's start on the Redis clock.
func (r *Reservation) Slot() time.Time { return r.slot }

// Reused reports a ticketed booking that found its standing booking.
func (r *Reservation) Reused() bool { return r.reused }

// ParseKey and ParseConcurrency are keyspace.Parse and the reading of a
// concurrency policy, for the tests.
var (
	ParseKey         = parseKey
	ParseConcurrency = parseConcurrency
)

// CanReserveAhead reports a policy that books later slots (gate.Meter).
func (l *Limiter) CanReserveAhead() bool { return l.spec.reservable }

// Heartbeat is how often a held Lease is renewed.
func (p Concurrency) Heartbeat() time.Duration { return p.heartbeat() }
