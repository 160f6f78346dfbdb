package throttle_test

import (
	"context"
	"errors"
	"math/big"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// TestCancelledScheduleStillConforms is the safety property of Cancel: take
// random reservations (some immediate, some ahead), Allows and
// cancellations on a meter, then replay every unit that was not cancelled,
// at the instant it was allowed to start, through a fresh reference model.
// Every one must conform: giving capacity back never lets the units that
// remain exceed the policy.
func TestCancelledScheduleStillConforms(t *testing.T) {
	for _, shape := range []struct {
		rate  throttle.Rate
		burst int
	}{
		{throttle.PerSecond(50), 1},
		{throttle.Rate{N: 3, Per: time.Second}, 4},
		{throttle.Rate{N: 7, Per: 1500 * time.Microsecond}, 13},
	} {
		for _, p := range []throttle.Policy{throttle.GCRA{Rate: shape.rate, Burst: shape.burst}, throttle.TokenBucket{Rate: shape.rate, Burst: shape.burst}} {
			t.Run(describe(p), func(t *testing.T) {
				t.Parallel() // CPU-bound, an embedded Redis of its own per seed: the shapes share the cores
				for seed := range uint64(8) {
					checkCancelledScheduleConforms(t, p, shape.rate, shape.burst, seed)
				}
			})
		}
	}
}

// unitRun is n units that ran (or will run) at start: µs on the server
// clock, exactly (a booking's slot can start between microseconds).
type unitRun struct {
	start *big.Rat
	n     int
}

func checkCancelledScheduleConforms(t *testing.T, p throttle.Policy, rate throttle.Rate, burst int, seed uint64) {
	t.Helper()
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	l := newLimiter(t, tg, p)
	ctx := context.Background()
	interval := rate.Per.Microseconds() / int64(rate.N)
	num, den := rate.Per.Microseconds(), int64(rate.N)
	tolerance := big.NewRat(num*int64(burst), den) // burst intervals, in µs
	exactStart := func(res *throttle.Reservation) *big.Rat {
		us, ticks := throttle.ReservationEnd(res)
		g := new(big.Int).GCD(nil, nil, big.NewInt(num), big.NewInt(den)).Int64()
		end := new(big.Rat).Add(big.NewRat(us, 1), big.NewRat(ticks, den/g))
		return end.Sub(end, tolerance)
	}
	rng := rand.New(rand.NewPCG(seed, 77))
	type booking struct {
		res  *throttle.Reservation
		run  unitRun
		gone bool
	}
	var bookings []*booking
	var runs []unitRun
	cancelled := 0
	for range 300 {
		clock.Advance(time.Duration(rng.Int64N(interval*int64(burst)+1)) * time.Microsecond)
		n := 1 + rng.IntN(burst)
		switch op := rng.IntN(10); {
		case op < 5:
			maxDelay := time.Duration(rng.Int64N(3*interval*int64(burst))) * time.Microsecond
			res, err := l.Reserve(ctx, "k", n, maxDelay)
			if err != nil {
				t.Fatal(err)
			}
			if res.OK {
				start := exactStart(res)
				if now := big.NewRat(throttle.ServerTime0(res), 1); start.Cmp(now) < 0 {
					start = now // within the burst: runs at once
				}
				bookings = append(bookings, &booking{res: res, run: unitRun{start, n}})
			}
		case op < 8 && len(bookings) > 0:
			b := bookings[rng.IntN(len(bookings))]
			if !b.gone {
				if err := b.res.Cancel(ctx); err != nil {
					t.Fatal(err)
				}
				b.gone = true
				cancelled++
			}
		default:
			if r := allowN(t, l, "k", n); r.Allowed {
				runs = append(runs, unitRun{big.NewRat(throttle.ServerTime(r), 1), n})
			}
		}
	}
	for _, b := range bookings {
		if !b.gone {
			runs = append(runs, b.run)
		}
	}
	if cancelled < 10 || len(runs) < 30 {
		t.Fatalf("seed %d: %d cancelled, %d runs: the walk did not exercise Cancel", seed, cancelled, len(runs))
	}
	sort.SliceStable(runs, func(i, j int) bool { return runs[i].start.Cmp(runs[j].start) < 0 })
	replay := newGCRAModel(rate.N, rate.Per, burst).(*gcraModel)
	for i, r := range runs {
		if d := replay.decideAt(r.start, int64(r.n), true); !d.Allowed {
			t.Fatalf("seed %d: run %d (%d units at %s µs) does not conform after cancellations: %+v", seed, i, r.n, r.start.FloatString(3), d)
		}
	}
}

func TestReserveForKeepsATicketsBooking(t *testing.T) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	l := newLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1})
	ctx := context.Background()
	allowN(t, l, "k", 1) // the burst is spent
	ticket := func(id string) throttle.Ticket { return throttle.Ticket{ID: id} }
	first, err := l.ReserveFor(ctx, "k", ticket("task-1"), 1, time.Minute)
	if err != nil || !first.OK || first.Reused() || first.Delay != 100*time.Millisecond {
		t.Fatalf("first booking: %+v, %v", first, err)
	}
	other, _ := l.ReserveFor(ctx, "k", ticket("task-2"), 1, time.Minute)
	// task-1 asks again before its slot: the same booking, nothing taken.
	clock.Advance(40 * time.Millisecond)
	again, err := l.ReserveFor(ctx, "k", ticket("task-1"), 1, time.Minute)
	if err != nil || !again.OK || !again.Reused() || again.Delay != 60*time.Millisecond {
		t.Fatalf("asking again: %+v, %v; want the standing booking, 60ms away", again, err)
	}
	if throttle.ServerStart(again) != throttle.ServerStart(first) {
		t.Fatalf("the standing booking moved: %d, then %d", throttle.ServerStart(first), throttle.ServerStart(again))
	}
	// At its slot it is still the ticket's; once the slot has passed, a new
	// booking is made behind the others.
	clock.Advance(60 * time.Millisecond)
	if at, _ := l.ReserveFor(ctx, "k", ticket("task-1"), 1, time.Minute); !at.Reused() || at.Delay != 0 {
		t.Fatalf("at the slot: %+v; want the standing booking, starting now", at)
	}
	clock.Advance(time.Millisecond)
	late, err := l.ReserveFor(ctx, "k", ticket("task-1"), 1, time.Minute)
	if err != nil || late.Reused() || throttle.ServerStart(late) != throttle.ServerStart(other)+100_000 {
		t.Fatalf("after the slot passed: %+v, %v; want a new booking after task-2's", late, err)
	}
	// Cancel drops the ticket with the capacity.
	if err := late.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	for _, key := range tg.Keys(t) {
		if key == l.Key("k")+":t:task-1" {
			t.Fatalf("the cancelled ticket %s is still there", key)
		}
	}
	checkTTLs(t, tg)
	if _, err := l.ReserveFor(ctx, "k", ticket(""), 1, time.Minute); !errors.Is(err, throttle.ErrInvalidKey) {
		t.Fatalf("an empty ticket: %v", err)
	}
	if _, err := l.ReserveFor(ctx, "k", throttle.Ticket{ID: "x", Grace: -1}, 1, time.Minute); !errors.Is(err, throttle.ErrInvalidDelay) {
		t.Fatalf("a negative grace: %v", err)
	}

	// With a grace, a booking can still be claimed after its slot started.
	graced := throttle.Ticket{ID: "task-3", Grace: 2 * time.Second}
	booked, _ := l.ReserveFor(ctx, "k", graced, 1, time.Minute)
	clock.Advance(booked.Delay + 1500*time.Millisecond)
	if late, _ := l.ReserveFor(ctx, "k", graced, 1, time.Minute); !late.Reused() || late.Delay != 0 {
		t.Fatalf("1.5s after the slot, within a 2s grace: %+v; want the booking, to run at once", late)
	}
	clock.Advance(501 * time.Millisecond)
	if gone, _ := l.ReserveFor(ctx, "k", graced, 1, time.Minute); gone.Reused() {
		t.Fatalf("after the grace: %+v; want a new booking", gone)
	}
}

// TestPresentReservationsCanBeTakenBack: on every policy, Reserve with no
// delay admits like AllowN, and Cancel gives the units back.
func TestPresentReservationsCanBeTakenBack(t *testing.T) {
	for _, a := range algorithms() {
		t.Run(a.name, func(t *testing.T) {
			tg := redistest.Embedded(t)
			clock := tg.Clock(t)
			l := newLimiter(t, tg, a.policy)
			ctx := context.Background()
			allowN(t, l, "k", 2)
			before := peek(t, l, "k")
			res, err := l.Reserve(ctx, "k", 3, 0)
			if err != nil || !res.OK || res.Delay != 0 || res.Remaining != 0 {
				t.Fatalf("Reserve(3, 0) on 3 remaining: %+v, %v", res, err)
			}
			if r := allowN(t, l, "k", 1); r.Allowed {
				t.Fatalf("the reservation did not take the capacity: %+v", r)
			}
			if err := res.Cancel(ctx); err != nil {
				t.Fatal(err)
			}
			if after := peek(t, l, "k"); after.Remaining != before.Remaining {
				t.Fatalf("after Cancel: %+v, before the reservation: %+v", after, before)
			}
			checkTTLs(t, tg)
			// Units counted in a window that has ended are not given back
			// into the next one.
			res, _ = l.Reserve(ctx, "k", 3, 0)
			clock.Advance(time.Second)
			full := peek(t, l, "k")
			if err := res.Cancel(ctx); err != nil {
				t.Fatal(err)
			}
			if after := peek(t, l, "k"); after.Remaining < full.Remaining || after.Remaining > 5 {
				t.Fatalf("cancelling after a window moved on: %+v, before %+v", after, full)
			}
		})
	}
}

// TestALeakyBucketGivesBackOnlyWhatHasNotLeaked: a reservation of a leaky
// bucket cancelled after its drops have leaked away gives nothing back, and
// one cancelled when part of them is left gives back that part: the units
// that remain respect the policy. (Cancel once took all n drops out
// whenever they were poured, and let a unit in beyond the rate.)
func TestALeakyBucketGivesBackOnlyWhatHasNotLeaked(t *testing.T) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	l := newLimiter(t, tg, throttle.LeakyBucket{Rate: throttle.PerMinute(1), Capacity: 2})
	ctx := context.Background()
	a, err := l.Reserve(ctx, "k", 1, 0)
	if err != nil || !a.OK {
		t.Fatalf("Reserve: %+v, %v", a, err)
	}
	clock.Advance(time.Minute) // a's drop has leaked away
	allowN(t, l, "k", 2)       // the bucket is full again
	if err := a.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	if r := allowN(t, l, "k", 1); r.Allowed {
		t.Fatalf("after cancelling a reservation whose drop had leaked: %+v; want the full bucket to refuse", r)
	}
	// Half of two drops poured on top of one left: the drain went to the
	// drop under them first, then to the first of theirs.
	clock.Advance(2 * time.Minute) // empty
	allowN(t, l, "k", 1)
	b, err := l.Reserve(ctx, "k", 1, 0)
	if err != nil || !b.OK {
		t.Fatalf("Reserve: %+v, %v", b, err)
	}
	clock.Advance(90 * time.Second) // the drop under b's and half of b's have leaked
	before := peek(t, l, "k")
	if err := b.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	after := peek(t, l, "k")
	if before.ResetAfter != 30*time.Second || after.ResetAfter != 0 {
		t.Fatalf("cancelling b with half its drop left: empty in %s before, %s after; want 30s, then at once", before.ResetAfter, after.ResetAfter)
	}
	checkTTLs(t, tg)
}

func TestTicketsNotBefore(t *testing.T) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	l := newLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 5})
	ctx := context.Background()
	late, err := l.ReserveFor(ctx, "k", throttle.Ticket{ID: "a", NotBefore: 2 * time.Second}, 1, time.Minute)
	if err != nil || !late.OK || late.Delay != 2*time.Second {
		t.Fatalf("NotBefore 2s on an idle key: %+v, %v", late, err)
	}
	// The meter is one instant: the capacity before the late slot goes
	// unused, and later requests queue behind it.
	if now := allowN(t, l, "k", 1); now.Allowed || now.RetryAfter != 2100*time.Millisecond {
		t.Fatalf("a request now, before the late booking: %+v", now)
	}
	next, _ := l.Reserve(ctx, "k", 1, time.Minute)
	if next.Delay != 2100*time.Millisecond {
		t.Fatalf("the booking after a NotBefore one: %s, want 2.1s", next.Delay)
	}
	clock.Advance(time.Second)
	if _, err := l.ReserveFor(ctx, "k", throttle.Ticket{ID: "c", NotBefore: -1}, 1, 0); !errors.Is(err, throttle.ErrInvalidDelay) {
		t.Fatalf("negative NotBefore: %v", err)
	}
}

// TestResetForgetsBookings: after a Reset, bookings made for the key with
// ReserveFor are gone: their tickets claim nothing, and the admissions
// after the Reset, claims included, keep the policy's spacing (1/s, burst
// 1: one admission per second on the Redis clock). Before, a ticket booked
// before the Reset still claimed its slot on top of the fresh key's
// capacity.
func TestResetForgetsBookings(t *testing.T) {
	for _, p := range []throttle.Policy{
		throttle.GCRA{Rate: throttle.PerSecond(1), Burst: 1},
		throttle.TokenBucket{Rate: throttle.PerSecond(1), Burst: 1},
	} {
		t.Run(describe(p), func(t *testing.T) {
			tg := redistest.Embedded(t)
			clock := tg.Clock(t)
			l := newLimiter(t, tg, p)
			ctx := context.Background()
			allowN(t, l, "k", 1)
			for _, ticket := range []string{"task-1", "task-2"} {
				res, err := l.ReserveFor(ctx, "k", throttle.Ticket{ID: ticket, Grace: 10 * time.Second}, 1, time.Hour)
				if err != nil || !res.OK || res.Delay == 0 {
					t.Fatalf("ReserveFor(%s): %+v, %v", ticket, res, err)
				}
			}
			clock.Advance(300 * time.Millisecond)
			if err := l.Reset(ctx, "k"); err != nil {
				t.Fatal(err)
			}
			var admitted []time.Time
			if r := allowN(t, l, "k", 1); r.Allowed {
				admitted = append(admitted, clock.Now())
			}
			for i, ticket := range []string{"task-1", "task-2"} {
				clock.Set(redistest.Start.Add(time.Duration(i+1) * time.Second))
				res, err := l.ReserveFor(ctx, "k", throttle.Ticket{ID: ticket}, 1, 0)
				if err != nil {
					t.Fatal(err)
				}
				if res.Reused() {
					t.Errorf("%s after the Reset: %+v; its booking was reset and must not be claimed", ticket, res)
				}
				if res.OK {
					admitted = append(admitted, res.Slot())
				}
			}
			for i := 1; i < len(admitted); i++ {
				if gap := admitted[i].Sub(admitted[i-1]); gap < time.Second {
					t.Errorf("admissions %s apart after the Reset; the policy allows one per second: %v", gap, admitted)
				}
			}
			// Nothing of the old bookings is left to claim, and every key
			// the limiter wrote expires.
			checkTTLs(t, tg)
		})
	}
}
