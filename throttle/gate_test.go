package throttle_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	workergate "github.com/jobthrottle/jobthrottle/internal/gate"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
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
		if _, _, err := workergate.EnterRoom(ctx, l, "all", "heavy-"+itoa(i), "heavy", 1, 1, 0, "h"); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := workergate.EnterRoom(ctx, l, "all", "light-0", "light", 1, 1, 0, "l"); err != nil {
		t.Fatal(err)
	}
	if c := claim(t, l, workergate.ClaimRequest{Key: "all", N: 1, Held: workergate.HeldByRoom, Ticket: "fresh", MaxWait: time.Second}); c.Status != workergate.NoCapacity || !c.Slot.IsZero() {
		t.Fatalf("a fresh start while others wait: %+v; want its turn from the room", c)
	}
	var order []string
	var slots []time.Time
	for len(order) < 5 {
		rel, err := workergate.Release(ctx, l, "all", 1, 50*time.Millisecond, 0, nil, workergate.Dispatcher{}, workergate.Batch{})
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
	if rel, err := workergate.Release(ctx, l, "all", 1, 50*time.Millisecond, 0, nil, workergate.Dispatcher{}, workergate.Batch{}); err != nil || rel.OK || !rel.Due.IsZero() {
		t.Fatalf("a release from the empty room: %+v, %v", rel, err)
	}
}

// TestRoomReleasesEveryWaiter: 105 waiters of one flow all come out, the
// 101st among them, whose tag is 10^8: a sorted set's score comes back
// written as a float ("1e+08" from miniredis), which the room must not
// need to read.
func TestRoomReleasesEveryWaiter(t *testing.T) {
	tg := redistest.New(t)
	l := newLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(1000000), Burst: 1000})
	ctx := context.Background()
	for i := range 105 {
		if _, _, err := workergate.EnterRoom(ctx, l, "all", fmt.Sprintf("w%03d", i), "f", 1, 1, 0, "p"); err != nil {
			t.Fatal(err)
		}
	}
	var order []string
	for range 110 {
		rel, err := workergate.Release(ctx, l, "all", 1, time.Second, 0, nil, workergate.Dispatcher{}, workergate.Batch{})
		if err != nil {
			t.Fatal(err)
		}
		if !rel.OK {
			break
		}
		order = append(order, rel.Waiter)
	}
	for i := range 105 {
		if i >= len(order) || order[i] != fmt.Sprintf("w%03d", i) {
			t.Fatalf("released %d waiters in the order %v; want all 105 in the order they entered", len(order), order)
		}
	}
}

// claim is workergate.ClaimAll under one meter, failing the test on an
// error.
func claim(t *testing.T, l *throttle.Limiter, req workergate.ClaimRequest) workergate.Claim {
	t.Helper()
	got, err := workergate.ClaimAll(context.Background(), []workergate.ClaimPart{{Limiter: l, Req: req}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return got.Claims[0]
}

// TestClaimsAreAtTheirSlots: a task released from a room starts at its slot
// on the Redis clock, not when it arrives, and so does its booking on
// another meter made for that instant; undone, the release is the task's
// again; a task that comes later than the grace has lost its slot and waits
// in the room again, in its place; a fresh task at an instant takes room
// there only if the meter has it then.
func TestClaimsAreAtTheirSlots(t *testing.T) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	room := newLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1})
	along := newLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(4), Burst: 1})
	ctx := context.Background()
	allowN(t, room, "r", 1) // the next start is 100ms away
	for _, w := range []string{"w1", "w2"} {
		if _, _, err := workergate.EnterRoom(ctx, room, "r", w, "f", 1, 1, 0, "q/"+w); err != nil {
			t.Fatal(err)
		}
	}
	rel, err := workergate.Release(ctx, room, "r", 1, 500*time.Millisecond, 0, nil, workergate.Dispatcher{}, workergate.Batch{})
	if err != nil || !rel.OK || rel.Waiter != "w1" || rel.Delay != 100*time.Millisecond || !rel.Slot.Equal(clock.Now().Add(100*time.Millisecond)) {
		t.Fatalf("Release: %+v, %v; want w1 with a slot 100ms away", rel, err)
	}
	b, err := workergate.BookAt(ctx, along, "a", "w1", 1, rel.Slot, 0, time.Minute)
	if err != nil || !b.OK || !b.Slot.Equal(rel.Slot) {
		t.Fatalf("BookAt: %+v, %v; want the slot asked for", b, err)
	}
	clock.Advance(30 * time.Millisecond)
	req := workergate.ClaimRequest{Key: "r", N: 1, Held: workergate.HeldByRoom, Ticket: "w1", Grace: 50 * time.Millisecond}
	c := claim(t, room, req)
	if c.Status != workergate.Admitted || c.Wait != 70*time.Millisecond || !c.Slot.Equal(rel.Slot) {
		t.Fatalf("the released waiter's claim: %+v; want it at its slot %s", c, rel.Slot)
	}
	if err := workergate.UndoClaim(ctx, room, "r", 1, workergate.HeldByRoom, "w1", c); err != nil {
		t.Fatal(err)
	}
	if again := claim(t, room, req); again.Status != workergate.Admitted || !again.Slot.Equal(rel.Slot) {
		t.Fatalf("the claim after the undo: %+v; want the release still the waiter's", again)
	}
	a := claim(t, along, workergate.ClaimRequest{Key: "a", N: 1, Held: workergate.HeldByTicket, Ticket: "w1", At: c.Slot, Grace: 50 * time.Millisecond})
	if a.Status != workergate.Admitted || !a.Slot.Equal(rel.Slot) {
		t.Fatalf("the booking's claim: %+v; want it at the same slot", a)
	}
	// A fresh task at the instant: the along meter has no room then, nor
	// until 250ms after it.
	f := claim(t, along, workergate.ClaimRequest{Key: "a", N: 1, At: c.Slot})
	if f.Status != workergate.NoCapacity || !f.Slot.Equal(rel.Slot.Add(250*time.Millisecond)) {
		t.Fatalf("a fresh claim at a taken instant: %+v; want no capacity until %s", f, rel.Slot.Add(250*time.Millisecond))
	}
	// w2, released, comes 60ms after its slot: too late.
	rel2, err := workergate.Release(ctx, room, "r", 1, 500*time.Millisecond, 0, nil, workergate.Dispatcher{}, workergate.Batch{})
	if err != nil || !rel2.OK || rel2.Waiter != "w2" {
		t.Fatalf("Release: %+v, %v; want w2", rel2, err)
	}
	clock.Set(rel2.Slot.Add(60 * time.Millisecond))
	late := claim(t, room, workergate.ClaimRequest{Key: "r", N: 1, Held: workergate.HeldByRoom, Ticket: "w2", Grace: 50 * time.Millisecond})
	if late.Status != workergate.Late || !late.Slot.Equal(rel2.Slot) {
		t.Fatalf("a claim 60ms after its slot: %+v; want it late", late)
	}
	rel3, err := workergate.Release(ctx, room, "r", 1, 500*time.Millisecond, 0, nil, workergate.Dispatcher{}, workergate.Batch{})
	if err != nil || !rel3.OK || rel3.Waiter != "w2" {
		t.Fatalf("Release after the late claim: %+v, %v; want w2 again", rel3, err)
	}
}

// TestWaitersKeepTheirPlace: a waiter that enters again (a task handed over
// to a copy of itself comes back under a new asynq ID) keeps its place and
// takes the new payload, which is what its release names; a booking at an
// instant replaces the ticket's booking for another instant rather than
// returning it; a released waiter whose key is blocked at its slot waits in
// the room again and is released after the block.
func TestWaitersKeepTheirPlace(t *testing.T) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	room := newLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1})
	along := newLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(4), Burst: 1})
	ctx := context.Background()
	for _, e := range []struct{ waiter, payload string }{{"w1", "q/copy-1"}, {"w2", "q/w2"}, {"w1", "q/copy-2"}} {
		if _, _, err := workergate.EnterRoom(ctx, room, "r", e.waiter, "f", 1, 1, 0, e.payload); err != nil {
			t.Fatal(err)
		}
	}
	rel, err := workergate.Release(ctx, room, "r", 1, 500*time.Millisecond, 0, nil, workergate.Dispatcher{}, workergate.Batch{})
	if err != nil || !rel.OK || rel.Waiter != "w1" || rel.Payload != "q/copy-2" {
		t.Fatalf("Release: %+v, %v; want w1 first, with the payload it entered with last", rel, err)
	}
	first, err := workergate.BookAt(ctx, along, "a", "w1", 1, rel.Slot, 0, time.Minute)
	if err != nil || !first.OK || !first.Slot.Equal(rel.Slot) {
		t.Fatalf("BookAt: %+v, %v; want the slot asked for", first, err)
	}
	later := rel.Slot.Add(time.Second)
	second, err := workergate.BookAt(ctx, along, "a", "w1", 1, later, 0, time.Minute)
	if err != nil || !second.OK || !second.Slot.Equal(later) {
		t.Fatalf("BookAt at another instant with the same ticket: %+v, %v; want the new instant %s", second, err, later)
	}
	if a := claim(t, along, workergate.ClaimRequest{Key: "a", N: 1, Held: workergate.HeldByTicket, Ticket: "w1", At: later, Grace: 50 * time.Millisecond}); a.Status != workergate.Admitted || !a.Slot.Equal(later) {
		t.Fatalf("the ticket's claim at the new instant: %+v", a)
	}

	// w2 is released, then its key is blocked for a second before its slot.
	rel2, err := workergate.Release(ctx, room, "r", 1, 500*time.Millisecond, 0, nil, workergate.Dispatcher{}, workergate.Batch{})
	if err != nil || !rel2.OK || rel2.Waiter != "w2" {
		t.Fatalf("Release: %+v, %v; want w2", rel2, err)
	}
	if err := room.BlockFor(ctx, "r", time.Second); err != nil {
		t.Fatal(err)
	}
	blocked := claim(t, room, workergate.ClaimRequest{Key: "r", N: 1, Held: workergate.HeldByRoom, Ticket: "w2", Grace: 50 * time.Millisecond})
	if blocked.Status != workergate.NoCapacity {
		t.Fatalf("a released waiter's claim on a blocked key: %+v; want none", blocked)
	}
	clock.Advance(time.Second)
	rel3, err := workergate.Release(ctx, room, "r", 1, 500*time.Millisecond, 0, nil, workergate.Dispatcher{}, workergate.Batch{})
	if err != nil || !rel3.OK || rel3.Waiter != "w2" {
		t.Fatalf("Release after the block: %+v, %v; want w2 again", rel3, err)
	}
}

// TestHeldFlowsDoNotBlockOthers: a flow held back (its own other limit has
// no room) does not keep the other flows waiting, however many of its
// waiters come first in the room's order; when its hold ends, its waiters
// go out again, in their order.
func TestHeldFlowsDoNotBlockOthers(t *testing.T) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	l := newLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(1000000), Burst: 1000})
	ctx := context.Background()
	enter := func(flow string, n int) {
		t.Helper()
		for i := range n {
			if _, _, err := workergate.EnterRoom(ctx, l, "all", fmt.Sprintf("%s-%03d", flow, i), flow, 1, 1, 0, "p"); err != nil {
				t.Fatal(err)
			}
		}
	}
	releaseAll := func(what string, want func(i int) string, n int) {
		t.Helper()
		for i := range n {
			rel, err := workergate.Release(ctx, l, "all", 1, time.Second, 0, nil, workergate.Dispatcher{}, workergate.Batch{})
			if err != nil {
				t.Fatal(err)
			}
			if !rel.OK || rel.Waiter != want(i) {
				t.Fatalf("release %d %s: %+v; want %s", i, what, rel, want(i))
			}
		}
	}
	enter("heavy", 300)
	enter("light", 400)
	rel, err := workergate.Release(ctx, l, "all", 1, time.Second, 0, nil, workergate.Dispatcher{}, workergate.Batch{})
	if err != nil || !rel.OK || rel.Waiter != "heavy-000" {
		t.Fatalf("Release: %+v, %v; want heavy-000", rel, err)
	}
	// heavy's own limit has no room for a minute: it is held back.
	if err := workergate.PutBack(ctx, l, "all", 1, rel, clock.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	enter("heavy", 1) // already there: keeps its place
	releaseAll("while heavy is held", func(i int) string { return fmt.Sprintf("light-%03d", i) }, 400)
	rel, err = workergate.Release(ctx, l, "all", 1, time.Second, 0, nil, workergate.Dispatcher{}, workergate.Batch{})
	if err != nil || rel.OK || !rel.Due.Equal(clock.Now().Add(time.Minute-time.Second)) {
		t.Fatalf("Release with only held waiters left: %+v, %v; want none, and a turn a lead before the hold ends", rel, err)
	}
	clock.Advance(time.Minute)
	releaseAll("after the hold", func(i int) string { return fmt.Sprintf("heavy-%03d", i) }, 300)
	if rel, err := workergate.Release(ctx, l, "all", 1, time.Second, 0, nil, workergate.Dispatcher{}, workergate.Batch{}); err != nil || rel.OK || !rel.Due.IsZero() {
		t.Fatalf("Release of an empty room: %+v, %v; want none", rel, err)
	}
}

// TestRoomReleasesUnitsInOrder: on GCRA 10/s burst 3, a waiter whose start
// takes 3 units keeps its turn until they fit and is released with them
// reserved; a waiter written before waiters had units (an earlier
// version's room) is read as taking 1.
func TestRoomReleasesUnitsInOrder(t *testing.T) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	l := newLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 3})
	ctx := context.Background()
	if _, _, err := workergate.EnterRoom(ctx, l, "all", "big", "f", 0, 3, 0, "b"); err != nil {
		t.Fatal(err)
	}
	old := fmt.Sprintf("%d|%d|%d|%s%s", clock.Now().UnixMicro(), 0, 1, "f", "o") // tag 0: first
	if err := tg.Client.HSet(ctx, l.Key("all")+":waiters", "old", old).Err(); err != nil {
		t.Fatal(err)
	}
	if err := tg.Client.ZAdd(ctx, l.Key("all")+":room", redis.Z{Score: 0, Member: "old"}).Err(); err != nil {
		t.Fatal(err)
	}
	first, err := workergate.Release(ctx, l, "all", 1, 50*time.Millisecond, 0, nil, workergate.Dispatcher{}, workergate.Batch{})
	if err != nil || !first.OK || first.Waiter != "old" || first.N != 1 || first.Payload != "o" || first.Flow != "f" {
		t.Fatalf("first release: %+v, %v; want the earlier version's waiter, taking 1 unit", first, err)
	}
	// The 3 units fit the burst once the first unit's interval has passed:
	// released 50 ms ahead of that, not sooner.
	if early, err := workergate.Release(ctx, l, "all", 1, 50*time.Millisecond, 0, nil, workergate.Dispatcher{}, workergate.Batch{}); err != nil || early.OK {
		t.Fatalf("a release 100ms before the 3 units fit: %+v, %v; want none (the waiter keeps its turn)", early, err)
	}
	clock.Advance(50 * time.Millisecond)
	second, err := workergate.Release(ctx, l, "all", 1, 50*time.Millisecond, 0, nil, workergate.Dispatcher{}, workergate.Batch{})
	if err != nil || !second.OK || second.Waiter != "big" || second.N != 3 {
		t.Fatalf("second release: %+v, %v; want the waiter of 3 units", second, err)
	}
	if got := second.Slot.Sub(first.Slot); got != 100*time.Millisecond {
		t.Errorf("the 3-unit waiter starts %s after the first, want 100ms", got)
	}
	// Its 3 units fill the burst: the next unit waits an interval (after
	// a 1-unit start it would not wait at all).
	if _, _, err := workergate.EnterRoom(ctx, l, "all", "next", "f", 0, 1, 0, "n"); err != nil {
		t.Fatal(err)
	}
	clock.Advance(second.Slot.Sub(clock.Now()) + 50*time.Millisecond)
	third, err := workergate.Release(ctx, l, "all", 1, 50*time.Millisecond, 0, nil, workergate.Dispatcher{}, workergate.Batch{})
	if err != nil || !third.OK || third.Slot.Sub(second.Slot) != 100*time.Millisecond {
		t.Fatalf("third release: %+v, %v; want a start an interval after the 3-unit one", third, err)
	}
}
