package throttle

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Reservation is capacity booked by [Limiter.Reserve]:
// the caller may start its n units at StartAt, and the capacity is already
// taken, so starting needs no further call to Redis. A Reservation's
// methods are safe for concurrent use.
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
	sp      *spec // the policy that booked it
	key     string
	ticket  string
	n       int
	// undo is what the script needs to give the units back: for GCRA and
	// TokenBucket the instant (µs, ticks) up to which capacity was spoken
	// for right after this booking; for LeakyBucket the instant its drops
	// were poured (µs) and the level under them (ticks); for the windows
	// where the units were counted.
	undo [2]int64
	// serverTime is the Redis clock at the decision and serverStart the
	// slot's start on it, rounded up, in µs.
	serverTime, serverStart int64
	// cause is the Redis failure behind a Degraded reservation.
	cause error
	// slot is StartAt on the Redis server's clock, exact to the
	// microsecond; zero when not OK or Degraded.
	slot time.Time
	// reused reports that a ticketed booking found the ticket's standing
	// booking and returned it instead of booking again.
	reused bool

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
// Only [TokenBucket] and [GCRA] book future slots: their state can go into
// debt up to maxDelay. The other policies book
// the present only: Reserve with maxDelay 0 is AllowN that can be taken
// back with Cancel, and a longer maxDelay fails with [ErrNotSupported]. A
// negative maxDelay fails with [ErrInvalidDelay]. When Redis cannot answer,
// the failure policy decides: [FailOpen] grants a Degraded reservation.
func (l *Limiter) Reserve(ctx context.Context, key string, n int, maxDelay time.Duration) (*Reservation, error) {
	if l.shares != nil {
		return nil, fmt.Errorf("%w: Reserve on a limiter with leased shares (WithLeasedShares)", ErrNotSupported)
	}
	return l.reserve(ctx, key, ticket{}, n, maxDelay)
}

// ticket names a caller that books now and comes to claim its booking
// later, such as a queued task (see gate.Ticket, which the worker fills).
type ticket struct {
	ID        string
	Grace     time.Duration
	NotBefore time.Duration

	// at, set by the worker (see gate.BookAt): the soonest the booking may
	// start as an instant of the Redis clock, Unix µs; maxDelay then counts
	// from it.
	at int64
}

// reserveFor is Reserve on behalf of a caller that will ask again later,
// such as a task that is enqueued now to run at its slot. Until the
// booking's grace after its slot's start, asking again with the same ticket
// ID returns that booking, marked reused (with Delay 0 once the slot has
// started), instead of booking anew: the task finds its slot waiting. The
// ticket lives in Redis, in the key's Cluster slot, until then. Only
// [TokenBucket] and [GCRA] keep tickets; the other policies ignore them. An
// empty ticket ID fails with [ErrInvalidKey], a negative Grace with
// [ErrInvalidDelay].
func (l *Limiter) reserveFor(ctx context.Context, key string, t ticket, n int, maxDelay time.Duration) (*Reservation, error) {
	if t.ID == "" {
		return nil, fmt.Errorf("%w: empty ticket ID", ErrInvalidKey)
	}
	if t.Grace < 0 || t.NotBefore < 0 {
		return nil, fmt.Errorf("%w: a ticket's grace and not-before must not be negative, got %s and %s", ErrInvalidDelay, t.Grace, t.NotBefore)
	}
	return l.reserve(ctx, key, t, n, maxDelay)
}

func (l *Limiter) reserve(ctx context.Context, key string, ticket ticket, n int, maxDelay time.Duration) (*Reservation, error) {
	start := l.began()
	res, err := l.bookOrGiveBack(ctx, key, ticket, n, maxDelay)
	if l.cfg.observer != nil || err != nil || (res != nil && res.Degraded) {
		var r Result
		if res != nil {
			r = Result{Allowed: res.OK, Degraded: res.Degraded, RetryAfter: res.RetryAfter, cause: res.cause, serverTime: res.serverStart, policy: res.sp}
		}
		l.observe(ctx, OpReserve, key, n, start, r, err)
	}
	return res, err
}

// bookOrGiveBack is book on a call that ctx's end does not cut short: by
// then Redis may have booked the slot, and a booking whose answer never
// came could not be given back. When ctx ends first it returns ctx's error
// at once, and the booking, once Redis has answered, is given back in the
// background (see Reservation.Cancel). A booking by ticket is left as it
// is: its caller asks again with the ticket and finds it.
func (l *Limiter) bookOrGiveBack(ctx context.Context, key string, t ticket, n int, maxDelay time.Duration) (*Reservation, error) {
	if ctx.Done() == nil || t.ID != "" {
		return l.book(ctx, key, t, n, maxDelay)
	}
	type booked struct {
		res *Reservation
		err error
	}
	done := make(chan booked, 1)
	go func() {
		res, err := l.book(context.WithoutCancel(ctx), key, t, n, maxDelay)
		done <- booked{res, err}
	}()
	giveBack := func(b booked) {
		if b.err == nil {
			_ = b.res.Cancel(context.Background())
		}
	}
	select {
	case b := <-done:
		if ctx.Err() == nil {
			return b.res, b.err
		}
		go giveBack(b) // ctx ended as the answer came: as if first
	case <-ctx.Done():
		go func() { giveBack(<-done) }()
	}
	return nil, l.unavailable(ctx, ctx.Err())
}

// book validates a reservation and runs its script.
func (l *Limiter) book(ctx context.Context, key string, t ticket, n int, maxDelay time.Duration) (*Reservation, error) {
	sp, err := l.specFor(ctx, key)
	if err != nil {
		return nil, err
	}
	if err := validRequest(key, n, sp.capacity); err != nil {
		return nil, err
	}
	var extra []string
	switch {
	case maxDelay < 0:
		return nil, fmt.Errorf("%w: the longest delay must not be negative, got %s", ErrInvalidDelay, maxDelay)
	case l.spec.reservable:
		extra = []string{itoa(sp.ticks(maxDelay)), itoa(sp.ticks(t.Grace)), itoa(sp.ticks(t.NotBefore)), itoa(t.at)}
	case maxDelay > 0:
		return nil, fmt.Errorf("%w: %T books only the present (maxDelay 0); use GCRA or TokenBucket to book ahead", ErrNotSupported, l.spec.policy)
	default:
		t = ticket{}
	}
	var reply reply
	if t.at > 0 {
		// Booked for the worker at an instant: after the key's starts too.
		keys, args := l.scriptArgs(sp, modeReserve, key, t.ID, n, extra...)
		reply, err = l.eval(ctx, meterBookingScript, append(keys, keys[0]+startsSuffix), args)
	} else {
		reply, err = l.runTicket(ctx, sp, modeReserve, key, t.ID, n, extra...)
	}
	if err != nil {
		if l.failOpen(ctx, err) {
			return &Reservation{OK: true, StartAt: time.Now(), Limit: sp.capacity, Degraded: true, cause: err, sp: sp}, nil
		}
		return nil, l.unavailable(ctx, err)
	}
	received := time.Now()
	r := resultOf(reply, sp.capacity)
	res := &Reservation{OK: r.Allowed, Limit: r.Limit, Remaining: r.Remaining, limiter: l, key: key, ticket: t.ID, n: n, sp: sp}
	if !res.OK {
		res.RetryAfter = r.RetryAfter
		return res, nil
	}
	if reply.n < 7 {
		return nil, l.unavailable(ctx, fmt.Errorf("script returned %d values for a booking, want 7", reply.n))
	}
	res.Delay, res.StartAt = r.RetryAfter, received.Add(r.RetryAfter)
	res.undo = [2]int64{reply.v[5], reply.v[6]}
	res.reused = reply.n > 7 && reply.v[7] == 1
	res.serverTime, res.serverStart = r.serverTime, r.serverTime+reply.v[2]
	res.slot = time.UnixMicro(res.serverStart)
	return res, nil
}

// ticks converts a delay to the policy's ticks (1/den µs), no longer than
// maxReserveDelay and small enough to keep the script's sums exact.
func (sp *spec) ticks(d time.Duration) int64 {
	us := min(d, maxReserveDelay).Microseconds()
	if us > maxExact/sp.den {
		return maxExact
	}
	return us * sp.den
}

// Cancel declares that the reserved units will not be used and gives their
// capacity back, as far as that is still possible: on the meters, the part
// of the booking that time has not already paid for, less what later
// bookings starting in the future stand on (so that no new booking can share
// a slot with theirs); on the windows, the units, if their window is still
// counting. Do not Cancel units that were used. Cancelling twice, or
// cancelling a reservation that was not OK, does nothing.
//
// Cancel returns once Redis has answered, or as soon as ctx ends: the
// giving back then goes on in the background, for up to the limiter's
// timeout (5 s without one), and Cancel returns ctx's error.
func (r *Reservation) Cancel(ctx context.Context) error {
	r.mu.Lock()
	if !r.OK || r.Degraded || r.cancelled {
		r.mu.Unlock()
		return nil
	}
	// Marked before the call: a second Cancel must never give the units
	// back twice, even while the first is still on its way.
	r.cancelled = true
	r.mu.Unlock()
	l := r.limiter
	undo := []string{itoa(r.undo[0]), itoa(r.undo[1])}
	err := l.cleanup(ctx, func(ctx context.Context) error {
		_, err := l.runTicket(ctx, r.sp, modeCancel, r.key, r.ticket, r.n, undo...)
		return err
	})
	if l.denied != nil {
		l.denied.forget(r.key) // the units given back may admit what it refused
	}
	if err != nil {
		return l.unavailable(ctx, err)
	}
	return nil
}

// Wait sleeps until StartAt. If ctx ends first, or its deadline falls
// before StartAt, Wait cancels the reservation (in the background when ctx
// has ended, see Cancel) and returns an error wrapping the context's error
// (context.DeadlineExceeded for a deadline that is too near).
func (r *Reservation) Wait(ctx context.Context) error {
	if !r.OK {
		return fmt.Errorf("%w: %q needs %s longer than the reservation allowed", ErrNotReserved, r.key, r.RetryAfter)
	}
	wait := time.Until(r.StartAt)
	if wait <= 0 {
		return nil
	}
	if deadline, ok := ctx.Deadline(); ok && deadline.Before(r.StartAt) {
		_ = r.Cancel(ctx)
		return fmt.Errorf("throttle: slot for %q starts %s after the context's deadline: %w",
			r.key, r.StartAt.Sub(deadline), context.DeadlineExceeded)
	}
	start := time.Now()
	err := sleep(ctx, wait)
	if err != nil {
		_ = r.Cancel(ctx)
	}
	if r.limiter != nil {
		r.limiter.observeWait(ctx, r.key, r.n, start, err)
	}
	return err
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
