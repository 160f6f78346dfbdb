package worker

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// task is what the gate knows of the task it decides about.
type task struct {
	*asynq.Task
	id     string // asynq's ID of this message
	origin string // the ID it is known by: its own, or the one it was copied from
	ticket string // names its bookings across attempts
	queue  string
	copies int  // hand-over copies made so far
	last   bool // no retries left: asynq would archive a returned error
	keys   []string
}

// pass is one attempt to get a task through all its rules. Either admitted
// is set, holding leases and bookings that start after delay, or refused
// is; err reports that Redis could not decide.
type pass struct {
	leases   []held
	bookings []booking
	delay    time.Duration // the latest booking's start
	reused   bool          // every delayed booking was the task's standing one
	degraded bool
	// presentOnly: the task is under several meters, whose units taken now
	// must be taken again when it waits for a slot it claimed.
	presentOnly bool

	refused *refusal
}

// held is a concurrency lease and the rule and key it was taken for.
type held struct {
	*throttle.Lease
	rule *Rule
	key  string
}

// booking is a reservation and the rule and key it was made for.
type booking struct {
	*throttle.Reservation
	rule *Rule
	key  string
}

// refusal says which rule turned the task away and when to try again.
type refusal struct {
	rule       *Rule
	key        string
	retryAfter time.Duration
	// kept: the task holds ticketed slots starting after retryAfter and
	// is to come back for them; otherwise it holds nothing.
	kept bool
	err  error // set when Redis could not decide
}

// unavailableBackoff is how long a task waits before asking again when
// Redis could not decide under fail-closed.
const unavailableBackoff = 5 * time.Second

// tryPass asks every rule of the task in turn: concurrency caps first, then
// rate rules. The first refusal gives back everything this pass took.
//
// A task under a single TokenBucket or GCRA rule books its slot ahead (and
// is sent back to it when it is far). A task under several claims a slot
// booked for it earlier (by Book) where it has one, and takes every other
// rate rule for now only: a meter keeps one instant per key, so slots booked
// ahead on two of them could not be lined up without one meter skipping
// capacity other keys need (an overall limit held back by one tenant's
// queue), and a unit started after its slot would bunch with the units
// after it. Deciding them at the same moment keeps every rule exact.
func (t *Throttler) tryPass(ctx context.Context, tk *task, rules []*Rule) *pass {
	p := &pass{reused: true}
	refuse := func(r *Rule, key string, retryAfter time.Duration, err error) *pass {
		p.giveBack(ctx, 0)
		p.refused = &refusal{rule: r, key: key, retryAfter: retryAfter, err: err}
		return p
	}
	meters := 0
	for _, r := range rules {
		if r.limiter != nil && r.limiter.CanReserveAhead() {
			meters++
		}
	}
	for _, group := range [3]func(*Rule) bool{
		func(r *Rule) bool { return r.conc != nil },
		func(r *Rule) bool { return r.limiter != nil && (!r.limiter.CanReserveAhead() || meters > 1) },
		func(r *Rule) bool { return r.limiter != nil && r.limiter.CanReserveAhead() && meters == 1 },
	} {
		for i, r := range rules {
			if !group(r) {
				continue
			}
			key := tk.keys[i]
			switch {
			case r.conc != nil:
				lease, res, err := r.conc.Acquire(ctx, key)
				if err != nil {
					return refuse(r, key, unavailableBackoff, err)
				}
				if lease == nil {
					return refuse(r, key, res.RetryAfter, nil)
				}
				p.leases = append(p.leases, held{lease, r, key})
				p.degraded = p.degraded || lease.Degraded()
			case r.limiter.CanReserveAhead() && meters == 1:
				res, err := t.reserveAhead(ctx, r, key, tk.ticket)
				if err != nil {
					return refuse(r, key, unavailableBackoff, err)
				}
				if !res.OK {
					return refuse(r, key, res.RetryAfter, nil)
				}
				p.add(booking{res, r, key})
			case r.limiter.CanReserveAhead() && tk.ticket != "":
				// Claim the task's booking, or take the present.
				p.presentOnly = true
				res, err := r.limiter.ReserveFor(ctx, key, throttle.Ticket{ID: tk.ticket}, 1, 0)
				if err != nil {
					return refuse(r, key, unavailableBackoff, err)
				}
				if !res.OK {
					return refuse(r, key, res.RetryAfter, nil)
				}
				p.add(booking{res, r, key})
			default:
				res, err := r.limiter.Reserve(ctx, key, 1, 0)
				if err != nil {
					return refuse(r, key, unavailableBackoff, err)
				}
				if !res.OK {
					return refuse(r, key, res.RetryAfter, nil)
				}
				p.add(booking{res, r, key})
			}
		}
	}
	return p
}

// reserveAhead books a slot up to the rule's BookAhead, under the task's
// ticket when it has one.
func (t *Throttler) reserveAhead(ctx context.Context, r *Rule, key, ticket string) (*throttle.Reservation, error) {
	if ticket == "" {
		return r.limiter.Reserve(ctx, key, 1, r.bookAhead)
	}
	return r.limiter.ReserveFor(ctx, key, throttle.Ticket{ID: ticket}, 1, r.bookAhead)
}

// slot returns when the pass's turn comes on the Redis server's clock: the
// start of its latest booking; zero when it holds none (a pass of
// concurrency caps only, or one let through degraded).
func (p *pass) slot() time.Time {
	var slot time.Time
	for _, b := range p.bookings {
		if b.Slot.After(slot) {
			slot = b.Slot
		}
	}
	return slot
}

func (p *pass) add(b booking) {
	p.bookings = append(p.bookings, b)
	p.degraded = p.degraded || b.Degraded
	if b.Delay > 0 && !b.Reused {
		p.reused = false
	}
	p.delay = max(p.delay, b.Delay)
}

// deferToLatest turns an admitted pass whose slots start too late to wait
// for into a refusal by the rule of the latest slot. The task keeps the
// slots that start keepFrom or later (0: none), which it will be back for
// (they are its place in line), and gives back the rest.
func (p *pass) deferToLatest(ctx context.Context, keepFrom time.Duration) {
	latest := p.latest()
	p.giveBack(ctx, keepFrom)
	p.refused = &refusal{rule: latest.rule, key: latest.key, retryAfter: p.delay, kept: true}
}

// latest returns the pass's booking that starts last, the first of them
// when several start together; the pass has at least one booking.
func (p *pass) latest() booking {
	latest := p.bookings[0]
	for _, b := range p.bookings[1:] {
		if b.Delay > latest.Delay {
			latest = b
		}
	}
	return latest
}

// giveBack releases the leases and cancels the bookings, except those that
// start keepFrom or later (0 keeps none): the task will come back for them.
// Each is given back while ctx lives, and in the background after it ends
// (throttle's Release and Cancel are bounded so).
func (p *pass) giveBack(ctx context.Context, keepFrom time.Duration) {
	for _, lease := range p.leases {
		_ = lease.Release(ctx)
	}
	p.leases = nil
	for _, b := range p.bookings {
		if keepFrom > 0 && b.Delay >= keepFrom {
			continue
		}
		_ = b.Cancel(ctx)
	}
	p.bookings = nil
}

// comeBackAfter is how long a refused task stays away: until its slot less
// the lead for a task keeping slots; otherwise the refusal's wait plus a
// random spread of up to as much again (1 s to 30 s), so that tasks turned
// away together do not return together. A full concurrency cap is asked
// again after about a second.
func (t *Throttler) comeBackAfter(r *refusal) time.Duration {
	switch {
	case r.kept:
		return max(0, r.retryAfter-t.lead())
	case r.rule.conc != nil && r.err == nil:
		return time.Second + rand.N(time.Second)
	}
	spread := min(max(r.retryAfter, time.Second), 30*time.Second)
	return r.retryAfter + rand.N(spread)
}
