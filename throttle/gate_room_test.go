package throttle_test

import (
	"context"
	"strings"
	"testing"
	"time"

	workergate "github.com/jobthrottle/jobthrottle/internal/gate"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// TestRoomReleaseGivesNotice: a waiter let out when the meter has had room
// for a while (its dispatcher came late, or nobody asked before) starts no
// sooner than the notice after its release, not at once; a release on time
// keeps the meter's own start, a lead after it; the notice is at most the
// lead.
func TestRoomReleaseGivesNotice(t *testing.T) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	l := newLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1})
	ctx := context.Background()
	for i := range 3 {
		if _, _, err := workergate.EnterRoom(ctx, l, "all", "w"+itoa(i), "f", 0, 1, 0, "p"); err != nil {
			t.Fatal(err)
		}
	}
	const lead, notice = 200 * time.Millisecond, 150 * time.Millisecond
	release := func(notice time.Duration) workergate.Released {
		t.Helper()
		rel, err := workergate.Release(ctx, l, "all", 1, lead, notice, nil, workergate.Dispatcher{}, workergate.Batch{})
		if err != nil {
			t.Fatal(err)
		}
		return rel
	}
	if rel := release(notice); !rel.OK || rel.Delay != notice {
		t.Fatalf("the meter has had room: %+v; want a start the notice, %s, after the release", rel, notice)
	}
	// The next start is 100 ms after that one: 250 ms away, beyond the lead.
	rel := release(notice)
	if rel.OK || !rel.Due.Equal(clock.Now().Add(50*time.Millisecond)) {
		t.Fatalf("right after: %+v; want nothing released until 50ms from now", rel)
	}
	clock.Set(rel.Due)
	if rel := release(notice); !rel.OK || rel.Delay != lead {
		t.Fatalf("on time: %+v; want the meter's start, a lead (%s) away", rel, lead)
	}
	clock.Advance(10 * time.Second)
	if rel := release(time.Second); !rel.OK || rel.Delay != lead {
		t.Fatalf("a notice of 1s with a lead of %s: %+v; want the start a lead away", lead, rel)
	}
}

// TestBookingSaysWhenTheMeterHasRoomAgain: a booking's Next is the soonest
// the meter has room for one more unit, to the microsecond: a rate's
// interval after the slot (a booking ahead speaks for the burst before it,
// so with a burst of 3 too); a booking at Next succeeds, one just before it
// does not.
func TestBookingSaysWhenTheMeterHasRoomAgain(t *testing.T) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	ctx := context.Background()
	cases := []struct {
		name   string
		policy throttle.Policy
		// after is Next less the slot
		after time.Duration
	}{
		{"gcra burst 1", throttle.GCRA{Rate: throttle.PerSecond(4), Burst: 1}, 250 * time.Millisecond},
		{"token bucket burst 1", throttle.TokenBucket{Rate: throttle.PerSecond(3), Burst: 1}, 333334 * time.Microsecond},
		{"gcra burst 3", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 3}, 100 * time.Millisecond},
	}
	for _, c := range cases {
		l := newLimiter(t, tg, c.policy)
		at := clock.Now().Add(200 * time.Millisecond)
		b, err := workergate.BookAt(ctx, l, "k", "first", 1, at, 0, time.Minute)
		if err != nil || !b.OK || !b.Slot.Equal(at) {
			t.Fatalf("%s: BookAt: %+v, %v; want the slot asked for", c.name, b, err)
		}
		if got := b.Next.Sub(b.Slot); got != c.after {
			t.Errorf("%s: Next is %s after the slot; want %s", c.name, got, c.after)
		}
		early, err := workergate.BookAt(ctx, l, "k", "early", 1, b.Next.Add(-time.Microsecond), 0, time.Minute)
		if err != nil || early.OK {
			t.Errorf("%s: a booking 1µs before Next: %+v, %v; want none", c.name, early, err)
		}
		next, err := workergate.BookAt(ctx, l, "k", "next", 1, b.Next, 0, time.Minute)
		if err != nil || !next.OK || !next.Slot.Equal(b.Next) {
			t.Errorf("%s: a booking at Next: %+v, %v; want it there", c.name, next, err)
		}
	}
}

// TestRoomHoldsAFlowItIsGiven: a release given a hold on a flow lets
// another flow's waiter out first, and the held flow's waiter at the
// hold's end; a hold that ends sooner than the flow's standing one
// changes nothing, nor one already past.
func TestRoomHoldsAFlowItIsGiven(t *testing.T) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	l := newLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(20), Burst: 1})
	ctx := context.Background()
	for _, w := range []struct{ id, flow string }{{"a1", "a"}, {"a2", "a"}, {"b1", "b"}} {
		if _, _, err := workergate.EnterRoom(ctx, l, "all", w.id, w.flow, 1, 1, 0, "p"); err != nil {
			t.Fatal(err)
		}
	}
	const lead = 300 * time.Millisecond
	release := func(holds ...workergate.Hold) workergate.Released {
		t.Helper()
		rel, err := workergate.Release(ctx, l, "all", 1, lead, 0, holds, workergate.Dispatcher{}, workergate.Batch{})
		if err != nil {
			t.Fatal(err)
		}
		return rel
	}
	// a1 goes first in tag order, at once.
	if rel := release(); !rel.OK || rel.Waiter != "a1" {
		t.Fatalf("first release: %+v; want a1", rel)
	}
	// Flow a held for 200 ms: b1 goes at the meter's next start, 50 ms on,
	// though a2's tag comes first; a shorter hold given meanwhile, and
	// one past, leave a's hold as it was.
	until := clock.Now().Add(200 * time.Millisecond)
	if rel := release(workergate.Hold{Flow: "a", Until: until}); !rel.OK || rel.Waiter != "b1" || rel.Delay != 50*time.Millisecond {
		t.Fatalf("with flow a held: %+v; want b1 50ms on", rel)
	}
	rel := release(workergate.Hold{Flow: "a", Until: clock.Now().Add(60 * time.Millisecond)}, workergate.Hold{Flow: "a", Until: clock.Now().Add(-time.Second)})
	if !rel.OK || rel.Waiter != "a2" || !rel.Slot.Equal(until) {
		t.Fatalf("flow a alone, held: %+v; want a2 at the hold's end %s", rel, until)
	}
}

// TestRoomCountsWaitersSetAside: the waiters of a flow held back beyond a
// release's lead are set aside, out of the room's order, and still counted
// when another waiter enters (the worker's fallback for a waiter counts on
// it: counted out, a held tenant's tasks came back through asynq before
// their turn).
func TestRoomCountsWaitersSetAside(t *testing.T) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	l := newLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(20), Burst: 1})
	ctx := context.Background()
	for i := range 3 {
		if _, _, err := workergate.EnterRoom(ctx, l, "all", "a"+itoa(i), "a", 1, 1, 0, "p"); err != nil {
			t.Fatal(err)
		}
	}
	hold := workergate.Hold{Flow: "a", Until: clock.Now().Add(10 * time.Second)}
	rel, err := workergate.Release(ctx, l, "all", 1, 300*time.Millisecond, 0, []workergate.Hold{hold}, workergate.Dispatcher{}, workergate.Batch{})
	if err != nil || rel.OK {
		t.Fatalf("a release with the only flow held for 10s: %+v, %v; want none", rel, err)
	}
	checkTTLs(t, tg) // the set aside, new, outlives its last write too
	size, _, err := workergate.EnterRoom(ctx, l, "all", "b0", "b", 1, 1, 0, "p")
	if err != nil || size != 4 {
		t.Fatalf("EnterRoom: %d waiters, %v; want 4, the three set aside among them", size, err)
	}
	if rel, err := workergate.Release(ctx, l, "all", 1, 300*time.Millisecond, 0, nil, workergate.Dispatcher{}, workergate.Batch{}); err != nil || !rel.OK || rel.Waiter != "b0" {
		t.Fatalf("the next release: %+v, %v; want b0, flow a being held", rel, err)
	}
}

// TestLeavingARoom: a waiter that leaves (its task given up on) is never
// let out: the next release lets out the one behind it. A waiter set aside
// leaves as well, and so does one let out that nobody came for; leaving
// twice, or a room one never entered, is no error.
func TestLeavingARoom(t *testing.T) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	l := newLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(20), Burst: 1})
	ctx := context.Background()
	enter := func(id, flow string) int {
		t.Helper()
		size, _, err := workergate.EnterRoom(ctx, l, "all", id, flow, 1, 1, 0, "p")
		if err != nil {
			t.Fatal(err)
		}
		return size
	}
	leave := func(id string) {
		t.Helper()
		if err := workergate.LeaveRoom(ctx, l, "all", id); err != nil {
			t.Fatalf("LeaveRoom(%s): %v", id, err)
		}
	}
	release := func(holds ...workergate.Hold) workergate.Released {
		t.Helper()
		rel, err := workergate.Release(ctx, l, "all", 1, 300*time.Millisecond, 0, holds, workergate.Dispatcher{}, workergate.Batch{})
		if err != nil {
			t.Fatal(err)
		}
		return rel
	}
	for i := range 3 {
		enter("a"+itoa(i), "a")
	}
	leave("a0")
	if rel := release(); !rel.OK || rel.Waiter != "a1" {
		t.Fatalf("the release after a0 left: %+v; want a1", rel)
	}
	leave("a1") // let out, and nobody came for it
	leave("a1")
	leave("nobody")
	if size := enter("b0", "b"); size != 2 {
		t.Fatalf("%d waiters after b0 entered; want 2 (a2, b0)", size)
	}
	clock.Advance(time.Second)
	if rel := release(workergate.Hold{Flow: "b", Until: clock.Now().Add(10 * time.Second)}); !rel.OK || rel.Waiter != "a2" {
		t.Fatalf("the release with flow b held: %+v; want a2", rel)
	}
	enter("b1", "b") // set aside behind b0: its flow is held
	leave("b0")
	if size := enter("c0", "c"); size != 2 {
		t.Fatalf("%d waiters after b0 left and c0 entered; want 2 (b1 set aside, c0)", size)
	}
}

// TestOneDispatcherLetsARoomsWaitersOut: a release by a dispatcher takes
// the room's lease; another dispatcher's release then lets nobody out and
// says when the lease ends (the lease's length after the holder's last
// release, which renews it); the other takes the room over once the lease
// has run out, or at once after the holder resigns. A release that asks
// for no lease is not stopped by one.
func TestOneDispatcherLetsARoomsWaitersOut(t *testing.T) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	l := newLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1})
	ctx := context.Background()
	for i := range 6 {
		if _, _, err := workergate.EnterRoom(ctx, l, "all", "w"+itoa(i), "f", 0, 1, 0, "p"); err != nil {
			t.Fatal(err)
		}
	}
	a := workergate.Dispatcher{ID: "a", Lease: 2 * time.Second}
	b := workergate.Dispatcher{ID: "b", Lease: 2 * time.Second}
	release := func(d workergate.Dispatcher) workergate.Released { t.Helper(); return releaseAs(t, l, d) }
	if rel := release(a); !rel.OK || rel.Elsewhere {
		t.Fatalf("a's first release: %+v; want a waiter let out", rel)
	}
	clock.Advance(time.Second)
	if rel := release(a); !rel.OK {
		t.Fatalf("a's second release: %+v; want a waiter let out (and the lease renewed)", rel)
	}
	leaseEnd := clock.Now().Add(2 * time.Second)
	clock.Advance(time.Second)
	if rel := release(b); rel.OK || !rel.Elsewhere || !rel.Due.Equal(leaseEnd) {
		t.Fatalf("b while a holds the lease: %+v; want nothing, Elsewhere, due %s", rel, leaseEnd)
	}
	if rel := release(workergate.Dispatcher{}); !rel.OK {
		t.Fatalf("a release that asks for no lease: %+v; want a waiter let out", rel)
	}
	clock.Set(leaseEnd)
	if rel := release(b); !rel.OK || rel.Elsewhere {
		t.Fatalf("b once a's lease has run out: %+v; want a waiter let out", rel)
	}
	clock.Advance(time.Second)
	if rel := release(a); rel.OK || !rel.Elsewhere {
		t.Fatalf("a once b holds the lease: %+v; want nothing, Elsewhere", rel)
	}
	if err := workergate.Resign(ctx, l, "all", a); err != nil {
		t.Fatal(err)
	}
	if rel := release(a); rel.OK || !rel.Elsewhere {
		t.Fatalf("a after resigning a lease it does not hold: %+v; want b's lease kept", rel)
	}
	if err := workergate.Resign(ctx, l, "all", b); err != nil {
		t.Fatal(err)
	}
	if rel := release(a); !rel.OK || rel.Elsewhere {
		t.Fatalf("a after b resigned: %+v; want a waiter let out", rel)
	}
}

// releaseAs lets the next waiter of l's room for key "all" out as
// dispatcher d, within a lead of 1 s, failing t on an error.
func releaseAs(t *testing.T, l *throttle.Limiter, d workergate.Dispatcher) workergate.Released {
	t.Helper()
	rel, err := workergate.Release(context.Background(), l, "all", 1, time.Second, 0, nil, d, workergate.Batch{})
	if err != nil {
		t.Fatal(err)
	}
	return rel
}

// TestAnEmptyRoomEndsItsLease: the holder's release that finds the room
// empty ends its lease, so that a waiter entering next hears that nobody
// holds it and another dispatcher lets it out at once, rather than after
// the lease would have run out (a fleet's next burst waited that long).
func TestAnEmptyRoomEndsItsLease(t *testing.T) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	l := newLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1})
	ctx := context.Background()
	a := workergate.Dispatcher{ID: "a", Lease: 5 * time.Second}
	b := workergate.Dispatcher{ID: "b", Lease: 5 * time.Second}
	release := func(d workergate.Dispatcher) workergate.Released { t.Helper(); return releaseAs(t, l, d) }
	if _, _, err := workergate.EnterRoom(ctx, l, "all", "w0", "f", 0, 1, 0, "p"); err != nil {
		t.Fatal(err)
	}
	if rel := release(a); !rel.OK || rel.Elsewhere {
		t.Fatalf("a's first release: %+v; want w0 let out", rel)
	}
	clock.Advance(time.Second)
	if rel := release(a); rel.OK || rel.Elsewhere || !rel.Due.IsZero() {
		t.Fatalf("a's release of the empty room: %+v; want nobody, no turn to come", rel)
	}
	clock.Advance(time.Second) // a's lease, had it stood, would last 4 s more
	_, lease, err := workergate.EnterRoom(ctx, l, "all", "w1", "f", 0, 1, 0, "p")
	if err != nil {
		t.Fatal(err)
	}
	if lease.Holder != "" {
		t.Fatalf("w1 entered a room whose lease %q holds till %s; want nobody holding it", lease.Holder, lease.Until)
	}
	if rel := release(b); !rel.OK || rel.Elsewhere || rel.Waiter != "w1" {
		t.Fatalf("b's release after w1 entered: %+v; want w1 let out", rel)
	}
	if rel := release(a); rel.OK || !rel.Elsewhere {
		t.Fatalf("a once b holds the lease: %+v; want nothing, Elsewhere", rel)
	}
}

// TestReleaseLetsSeveralOutInOneCall: with a batch, one release lets out
// the waiters it was prepared for while their starts fall within the lead
// and the window after it, up to the most asked, each at its own slot on
// the meter (50 ms apart at 20/s), and names the waiters next in the
// room's order; the call after it lets nobody out before the next start
// is a lead away; a waiter not prepared for is the last of its call.
func TestReleaseLetsSeveralOutInOneCall(t *testing.T) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	l := newLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(20), Burst: 1})
	ctx := context.Background()
	for i := range 6 {
		if _, _, err := workergate.EnterRoom(ctx, l, "all", "w"+itoa(i), "f", 0, 1, 0, "p"+itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	// Waiters it was prepared for (here with no other meters, and tasks
	// asynq no longer has).
	batch := workergate.Batch{Window: 100 * time.Millisecond, Most: 4}
	for i := range 6 {
		id := "task" + itoa(i)
		batch.Prepared = append(batch.Prepared, &workergate.Prepared{Waiter: "w" + itoa(i), TaskID: id,
			TaskKeys: []string{tg.Prefix + "retry", tg.Prefix + "scheduled", tg.Prefix + "pending", tg.Prefix + "t:" + id}})
	}
	rel, err := workergate.Release(ctx, l, "all", 1, 100*time.Millisecond, 0, nil, workergate.Dispatcher{}, batch)
	if err != nil || !rel.OK || len(rel.More) != 3 {
		t.Fatalf("a batch of 4: %+v, %v; want four waiters let out", rel, err)
	}
	for i, r := range append([]workergate.Released{rel}, rel.More...) {
		want := clock.Now().Add(time.Duration(i) * 50 * time.Millisecond)
		if r.Waiter != "w"+itoa(i) || r.Payload != "p"+itoa(i) || !r.Slot.Equal(want) {
			t.Errorf("let out %d: %s (%q) at %s; want w%d at %s", i, r.Waiter, r.Payload, r.Slot, i, want)
		}
	}
	if len(rel.Next) != 2 || rel.Next[0].ID != "w4" || rel.Next[1].ID != "w5" || rel.Next[0].Payload != "p4" {
		t.Errorf("next in order: %+v; want w4 and w5 with their payloads", rel.Next)
	}
	again, err := workergate.Release(ctx, l, "all", 1, 100*time.Millisecond, 0, nil, workergate.Dispatcher{}, batch)
	if err != nil || again.OK || !again.Due.Equal(clock.Now().Add(100*time.Millisecond)) {
		t.Fatalf("right after: %+v, %v; want nobody until the next start (200ms) is a lead away", again, err)
	}
	// A waiter not prepared for ends the call: the caller books its other
	// meters and learns from them.
	clock.Advance(100 * time.Millisecond)
	batch.Prepared = nil
	if rel, err := workergate.Release(ctx, l, "all", 1, 100*time.Millisecond, 0, nil, workergate.Dispatcher{}, batch); err != nil || !rel.OK || len(rel.More) != 0 {
		t.Fatalf("not prepared for: %+v, %v; want one waiter let out", rel, err)
	}
}

// TestAHeldFlowComesBackWithinOneRelease: a release that looks further
// ahead after its first waiter (its window) brings back the waiters of a
// flow whose hold ends within that window and lets them out in the same
// call, one after the other as each comes back, at the hold's end and the
// meter's next start; nothing is left set aside, and every key the call
// wrote expires.
func TestAHeldFlowComesBackWithinOneRelease(t *testing.T) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	l := newLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(20), Burst: 1})
	ctx := context.Background()
	batch := workergate.Batch{Window: 200 * time.Millisecond, Most: 4}
	for i, w := range []struct{ id, flow string }{{"a1", "a"}, {"a2", "a"}, {"b1", "b"}} {
		// First come, first served: a1, a2, then b1.
		if _, _, err := workergate.EnterRoom(ctx, l, "all", w.id, w.flow, 0, 1, 0, "p"+w.id); err != nil {
			t.Fatal(err)
		}
		id := "task" + itoa(i)
		batch.Prepared = append(batch.Prepared, &workergate.Prepared{Waiter: w.id, TaskID: id,
			TaskKeys: []string{tg.Prefix + "retry", tg.Prefix + "scheduled", tg.Prefix + "pending", tg.Prefix + "t:" + id}})
	}
	// Flow a is held for 150 ms, beyond the lead (100 ms) but within the
	// window after it: a1 and a2 are set aside, b1 goes at once, and then
	// a1 at the hold's end and a2 at the meter's next start.
	hold := workergate.Hold{Flow: "a", Until: clock.Now().Add(150 * time.Millisecond)}
	rel, err := workergate.Release(ctx, l, "all", 1, 100*time.Millisecond, 0, []workergate.Hold{hold}, workergate.Dispatcher{}, batch)
	if err != nil || !rel.OK {
		t.Fatalf("Release: %+v, %v; want waiters let out", rel, err)
	}
	want := []struct {
		id string
		at time.Duration
	}{{"b1", 0}, {"a1", 150 * time.Millisecond}, {"a2", 200 * time.Millisecond}}
	got := append([]workergate.Released{rel}, rel.More...)
	if len(got) != len(want) {
		t.Fatalf("let out %d in one call: %+v; want %d", len(got), got, len(want))
	}
	for i, w := range want {
		if got[i].Waiter != w.id || got[i].Payload != "p"+w.id || !got[i].Slot.Equal(clock.Now().Add(w.at)) {
			t.Errorf("let out %d: %s (%q) at %s; want %s at +%s", i, got[i].Waiter, got[i].Payload, got[i].Slot, w.id, w.at)
		}
	}
	for _, k := range tg.Keys(t) {
		if strings.HasSuffix(k, ":aside") {
			n, err := tg.Client.ZCard(ctx, k).Result()
			t.Errorf("after the call %s holds %d waiters set aside (%v); want none", k, n, err)
		}
	}
	checkTTLs(t, tg)
	// The meter's instant holds all three: the next start is 250 ms on.
	again, err := workergate.Release(ctx, l, "all", 1, 100*time.Millisecond, 0, nil, workergate.Dispatcher{}, workergate.Batch{})
	if err != nil || again.OK || !again.Due.IsZero() {
		t.Fatalf("right after: %+v, %v; want nobody, the room empty", again, err)
	}
}

// TestEntriesKeepARoomsHeldFlowsWhileNobodyIsLetOut: while a room's meter
// lets nobody out (blocked for days), only entries write to the room;
// each keeps every key of the room, the waiters set aside and the holds
// among them, so that a held flow's waiters are still there, in order,
// when the meter lets anyone out again.
func TestEntriesKeepARoomsHeldFlowsWhileNobodyIsLetOut(t *testing.T) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	l := newLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(20), Burst: 1})
	ctx := context.Background()
	if _, _, err := workergate.EnterRoom(ctx, l, "all", "a1", "a", 1, 1, 0, "p"); err != nil {
		t.Fatal(err)
	}
	// Flow a held for two days: a1 is set aside.
	hold := workergate.Hold{Flow: "a", Until: clock.Now().Add(48 * time.Hour)}
	if rel, err := workergate.Release(ctx, l, "all", 1, 300*time.Millisecond, 0, []workergate.Hold{hold}, workergate.Dispatcher{}, workergate.Batch{}); err != nil || rel.OK {
		t.Fatalf("a release with flow a held: %+v, %v; want none", rel, err)
	}
	if err := l.BlockFor(ctx, "all", 72*time.Hour); err != nil {
		t.Fatal(err)
	}
	// Others enter every 20 hours; nobody is let out.
	for i := range 3 {
		clock.Advance(20 * time.Hour)
		if _, _, err := workergate.EnterRoom(ctx, l, "all", "b"+itoa(i), "b", 1, 1, 0, "p"); err != nil {
			t.Fatal(err)
		}
		if rel, err := workergate.Release(ctx, l, "all", 1, 300*time.Millisecond, 0, nil, workergate.Dispatcher{}, workergate.Batch{}); err != nil || rel.OK {
			t.Fatalf("a release while blocked: %+v, %v; want none", rel, err)
		}
	}
	// 60 hours on: a's hold has ended and the block will soon. a1 comes
	// back, and goes first, its tag before the b's.
	size, _, err := workergate.EnterRoom(ctx, l, "all", "c0", "c", 1, 1, 0, "p")
	if err != nil || size != 5 {
		t.Fatalf("EnterRoom: %d waiters, %v; want 5, a1 set aside among them", size, err)
	}
	clock.Advance(12 * time.Hour)
	rel, err := workergate.Release(ctx, l, "all", 1, 300*time.Millisecond, 0, nil, workergate.Dispatcher{}, workergate.Batch{})
	if err != nil || !rel.OK || rel.Waiter != "a1" {
		t.Fatalf("the first release after the block: %+v, %v; want a1", rel, err)
	}
}
