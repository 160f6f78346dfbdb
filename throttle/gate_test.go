package throttle_test

import (
	"context"
	"testing"
	"time"

	workergate "github.com/jobthrottle/jobthrottle/internal/gate"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// startOn is workergate.StartOn, failing the test on an error.
func startOn(t *testing.T, l *throttle.Limiter, req workergate.StartRequest) workergate.Start {
	t.Helper()
	s, err := workergate.StartOn(context.Background(), l, req)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestStartsAreSpacedHoweverLate: tasks holding bookings start no closer
// than the rate on the Redis clock, however late they arrive for their
// slots; a late one starts in the gap it left; a fresh one starts only when
// the planned meter has room.
func TestStartsAreSpacedHoweverLate(t *testing.T) {
	for _, p := range []throttle.Policy{
		throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1},
		throttle.TokenBucket{Rate: throttle.PerSecond(10), Burst: 1},
	} {
		t.Run(describe(p), func(t *testing.T) {
			tg := redistest.Embedded(t)
			clock := tg.Clock(t)
			l := newLimiter(t, tg, p)
			ctx := context.Background()
			first := startOn(t, l, workergate.StartRequest{Key: "k", N: 1})
			if first.Status != workergate.Admitted || first.Wait != 0 {
				t.Fatalf("a fresh start on a fresh key: %+v", first)
			}
			if s := startOn(t, l, workergate.StartRequest{Key: "k", N: 1}); s.Status != workergate.NoCapacity || s.Wait != 100*time.Millisecond {
				t.Fatalf("a second fresh start at once: %+v; want no capacity for 100ms", s)
			}
			// Two tasks book slots 100 and 200 ms out, and go away.
			for _, ticket := range []string{"a", "b"} {
				res, err := l.ReserveFor(ctx, "k", throttle.Ticket{ID: ticket, Grace: 10 * time.Second}, 1, time.Hour)
				if err != nil || !res.OK {
					t.Fatalf("ReserveFor(%s): %+v, %v", ticket, res, err)
				}
			}
			// "a" is 150 ms late; "b" arrives 10 ms after it, 60 ms early.
			clock.Advance(250 * time.Millisecond)
			a := startOn(t, l, workergate.StartRequest{Key: "k", N: 1, Held: workergate.HeldByTicket, Ticket: "a", MaxWait: time.Second})
			clock.Advance(10 * time.Millisecond)
			b := startOn(t, l, workergate.StartRequest{Key: "k", N: 1, Held: workergate.HeldByTicket, Ticket: "b", MaxWait: time.Second})
			if a.Status != workergate.Admitted || a.Wait != 0 {
				t.Fatalf("the late task: %+v; want to start at once, in the gap it left", a)
			}
			if b.Status != workergate.Admitted || b.At.Sub(a.At) != 100*time.Millisecond {
				t.Fatalf("the next task: %+v; want its start 100ms after the late one's (%s)", b, a.At)
			}
			// A start that would come after MaxWait is refused, the booking kept.
			clock.Advance(10 * time.Millisecond)
			res, err := l.ReserveFor(ctx, "k", throttle.Ticket{ID: "c", Grace: 10 * time.Second}, 1, time.Hour)
			if err != nil || !res.OK {
				t.Fatalf("ReserveFor(c): %+v, %v", res, err)
			}
			if c := startOn(t, l, workergate.StartRequest{Key: "k", N: 1, Held: workergate.HeldByTicket, Ticket: "c", MaxWait: 10 * time.Millisecond}); c.Status != workergate.TooLate {
				t.Fatalf("a start 80ms out with 10ms to wait: %+v; want TooLate", c)
			}
			if c := startOn(t, l, workergate.StartRequest{Key: "k", N: 1, Held: workergate.HeldByTicket, Ticket: "c", MaxWait: time.Second}); c.Status != workergate.Admitted || c.At.Sub(b.At) != 100*time.Millisecond {
				t.Fatalf("the booking kept: %+v; want its start 100ms after the last (%s)", c, b.At)
			}
		})
	}
}

// TestUndoStartGivesBack: a start undone gives back its capacity on both
// instants, and a release it used.
func TestUndoStartGivesBack(t *testing.T) {
	tg := redistest.Embedded(t)
	tg.Clock(t)
	l := newLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1})
	ctx := context.Background()
	s := startOn(t, l, workergate.StartRequest{Key: "k", N: 1})
	if err := workergate.UndoStart(ctx, l, "k", 1, workergate.HeldNowhere, "", s); err != nil {
		t.Fatal(err)
	}
	if again := startOn(t, l, workergate.StartRequest{Key: "k", N: 1}); again.Status != workergate.Admitted || again.Wait != 0 {
		t.Fatalf("after the undo: %+v; want a start at once", again)
	}
	// A released waiter's start, undone, finds its release again.
	if _, err := workergate.EnterRoom(ctx, l, "r", "w1", "f", 1, redistest.Start, "q/t1"); err != nil {
		t.Fatal(err)
	}
	rel, err := workergate.Release(ctx, l, "r", 1, 500*time.Millisecond)
	if err != nil || !rel.OK || rel.Waiter != "w1" || rel.Payload != "q/t1" {
		t.Fatalf("Release: %+v, %v", rel, err)
	}
	started := startOn(t, l, workergate.StartRequest{Key: "r", N: 1, Held: workergate.HeldByRoom, Ticket: "w1", MaxWait: time.Second})
	if started.Status != workergate.Admitted {
		t.Fatalf("the released waiter's start: %+v", started)
	}
	if err := workergate.UndoStart(ctx, l, "r", 1, workergate.HeldByRoom, "w1", started); err != nil {
		t.Fatal(err)
	}
	if again := startOn(t, l, workergate.StartRequest{Key: "r", N: 1, Held: workergate.HeldByRoom, Ticket: "w1", MaxWait: time.Second}); again.Status != workergate.Admitted {
		t.Fatalf("the release after the undo: %+v; want it still held", again)
	}
}

// TestRoomReleasesFairly: waiters of a heavy flow that entered first do not
// hold back a newcomer's; releases come at the meter's rate, no sooner; a
// fresh start waits its turn while others wait in the room.
func TestRoomReleasesFairly(t *testing.T) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	l := newLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1})
	ctx := context.Background()
	for i := range 4 {
		if _, err := workergate.EnterRoom(ctx, l, "all", "heavy-"+itoa(i), "heavy", 1, clock.Now(), "h"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := workergate.EnterRoom(ctx, l, "all", "light-0", "light", 1, clock.Now(), "l"); err != nil {
		t.Fatal(err)
	}
	if s := startOn(t, l, workergate.StartRequest{Key: "all", N: 1, Held: workergate.HeldByRoom, Ticket: "fresh"}); s.Status != workergate.NoCapacity {
		t.Fatalf("a fresh start while others wait: %+v; want its turn from the room", s)
	}
	var order []string
	var slots []time.Time
	for len(order) < 5 {
		rel, err := workergate.Release(ctx, l, "all", 1, 50*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if !rel.OK {
			if rel.Due.IsZero() {
				t.Fatalf("the room emptied after %v", order)
			}
			if rel.Due.Before(clock.Now()) {
				t.Fatalf("nothing released, due %s, before now %s", rel.Due, clock.Now())
			}
			clock.Set(rel.Due)
			continue
		}
		order = append(order, rel.Waiter)
		slots = append(slots, clock.Now().Add(rel.Delay))
	}
	if order[0] != "heavy-0" || order[1] != "light-0" {
		t.Fatalf("released in the order %v; want the newcomer second", order)
	}
	for i := 1; i < len(slots); i++ {
		if gap := slots[i].Sub(slots[i-1]); gap < 100*time.Millisecond {
			t.Fatalf("releases' starts %v: %s apart, the rate allows 100ms", slots, gap)
		}
	}
	if rel, err := workergate.Release(ctx, l, "all", 1, 50*time.Millisecond); err != nil || rel.OK || !rel.Due.IsZero() {
		t.Fatalf("a release from the empty room: %+v, %v", rel, err)
	}
}
