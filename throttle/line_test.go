package throttle_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	workergate "github.com/jobthrottle/jobthrottle/internal/gate"
	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// capOf returns a ConcurrencyLimiter of limit on the target.
func capOf(t *testing.T, tg *redistest.Target, limit int) *throttle.ConcurrencyLimiter {
	t.Helper()
	return newConcurrency(t, tg.Client, tg.Prefix, throttle.Concurrency{Limit: limit, Lease: 10 * time.Second})
}

// TestAcquireWaitServesInOrder: waiters get the slot in the order they
// came, each woken when the holder before it releases; while they wait,
// Acquire gets nothing.
func TestAcquireWaitServesInOrder(t *testing.T) {
	tg := redistest.New(t)
	c := capOf(t, tg, 1)
	ctx := context.Background()
	first, err := c.AcquireWait(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var order []int
	leases := make(chan *throttle.Lease)
	for i := range 3 {
		go func() {
			l, err := c.AcquireWait(ctx, "k")
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			leases <- l
		}()
		waitAhead(t, c, "k", i+1) // in line in this order
	}
	if l, r, err := c.Acquire(ctx, "k"); err != nil || l != nil || r.Allowed {
		t.Fatalf("Acquire while three wait: %+v, %v; want nothing", r, err)
	}
	held := first
	for range 3 {
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		held = <-leases
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if order[0] != 0 || order[1] != 1 || order[2] != 2 {
		t.Fatalf("served in the order %v; want the order they came", order)
	}
	if l, _, err := c.Acquire(ctx, "k"); err != nil || l == nil {
		t.Fatalf("Acquire once nobody waits: %v; want the slot", err)
	}
}

// waitAhead waits until n waiters stand in key's line.
func waitAhead(t *testing.T, c *throttle.ConcurrencyLimiter, key string, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		waiting, err := throttle.LineLen(context.Background(), c, key)
		if err != nil {
			t.Fatal(err)
		}
		if (n == 0 && waiting == 0) || (n > 0 && waiting >= n) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters in line after 5 s; want %d", waiting, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestAcquireWaitIsWokenAtOnce: a waiter gets a freed slot within 50 ms of
// its release (woken through pub/sub, not by its once-a-second look), here
// measured on the wall clock from Release's return to AcquireWait's, ten
// times; the bound is the issue's own, the wake-up itself takes about a
// millisecond.
func TestAcquireWaitIsWokenAtOnce(t *testing.T) {
	tg := redistest.New(t)
	c := capOf(t, tg, 1)
	ctx := context.Background()
	var worst time.Duration
	for range 10 {
		held, err := c.AcquireWait(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan time.Time, 1)
		go func() {
			l, err := c.AcquireWait(ctx, "k")
			if err != nil {
				t.Error(err)
				got <- time.Time{}
				return
			}
			got <- time.Now()
			_ = l.Release(ctx)
		}()
		waitAhead(t, c, "k", 1)
		time.Sleep(20 * time.Millisecond) // past its first look
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		released := time.Now()
		at := <-got
		if at.IsZero() {
			t.FailNow()
		}
		worst = max(worst, at.Sub(released))
		waitAhead(t, c, "k", 0)
	}
	t.Logf("figures: a waiter had the slot at most %s after the release returned (10 tries)", worst)
	if worst > 50*time.Millisecond {
		t.Fatalf("a waiter took the freed slot %s after its release; want within 50 ms", worst)
	}
}

// TestAcquireWaitLeavesOnCancel: a waiter whose context ends leaves the
// line and returns the context's error; the one behind it gets the slot.
func TestAcquireWaitLeavesOnCancel(t *testing.T) {
	tg := redistest.New(t)
	c := capOf(t, tg, 1)
	ctx := context.Background()
	held, err := c.AcquireWait(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	errs := make(chan error, 1)
	go func() {
		_, err := c.AcquireWait(cancelled, "k")
		errs <- err
	}()
	waitAhead(t, c, "k", 1)
	leases := make(chan *throttle.Lease, 1)
	go func() {
		l, _ := c.AcquireWait(ctx, "k")
		leases <- l
	}()
	waitAhead(t, c, "k", 2)
	cancel()
	if err := <-errs; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled waiter: %v; want context.Canceled", err)
	}
	_ = held.Release(ctx)
	select {
	case l := <-leases:
		_ = l.Release(ctx)
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter behind the cancelled one never got the slot")
	}
}

// TestParkedWaitersAreCalledBack: a waiter parked away keeps its place; a
// release that frees a slot near it hands its payload to the call function,
// once; a waiter that stops showing itself drops out of the line.
func TestParkedWaitersAreCalledBack(t *testing.T) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	c := capOf(t, tg, 1)
	ctx := context.Background()
	var calls []string
	workergate.OnCapCall(c, func(ps []string) { calls = append(calls, ps...) }, nil)
	held, _, _, err := workergate.CapWait(ctx, c, "k", "w0", 0, nil)
	if err != nil || held == nil {
		t.Fatalf("CapWait on a free slot: %v, %v", held, err)
	}
	for _, w := range []string{"w1", "w2", "w3"} {
		if l, _, parked, err := workergate.CapWait(ctx, c, "k", w, 0, parkAs(w)); err != nil || l != nil || !parked {
			t.Fatalf("CapWait(%s) with the slot held: %v, parked %v, %v; want it parked in line", w, l, parked, err)
		}
	}
	clock.Advance(4 * time.Second) // past their tasks' way back, not their parking
	if err := held.(*throttle.Lease).Release(ctx); err != nil {
		t.Fatal(err)
	}
	// One slot free and one slot's worth of calls ahead: w1 and w2.
	if len(calls) != 2 || calls[0] != "payload-w1" || calls[1] != "payload-w2" {
		t.Fatalf("calls after the release: %q; want w1's and w2's payloads", calls)
	}
	// w1 comes back and takes the slot; w2, called already, is not called
	// again by the next release.
	l1, _, _, err := workergate.CapWait(ctx, c, "k", "w1", 0, nil)
	if err != nil || l1 == nil {
		t.Fatalf("w1 back: %v, %v; want the slot", l1, err)
	}
	if err := l1.(*throttle.Lease).Release(ctx); err != nil {
		t.Fatal(err)
	}
	if len(calls) != 3 || calls[2] != "payload-w3" {
		t.Fatalf("calls after the second release: %q; want w3's added only", calls)
	}
	// Parked entries last their ttl: after it, the line is empty.
	clock.Advance(2 * time.Minute)
	if l, _, err := c.Acquire(ctx, "k"); err != nil || l == nil {
		t.Fatalf("Acquire after the parked waiters ran out: %v; want the slot", err)
	}
}

// TestReleaseHandsTheSlotOver: a release hands the freed slot to the
// first waiter in line, which learns it from the release's message and
// holds the slot without asking again: one call of its own in all (the
// one that stood it in line); the slot is held for it meanwhile, so
// Acquire gets nothing.
func TestReleaseHandsTheSlotOver(t *testing.T) {
	tg := redistest.New(t)
	holder := capOf(t, tg, 1)
	calls := &commandCounter{count: map[string]int{}}
	own := tg.NewClient(t)
	own.AddHook(calls)
	waiter := newConcurrency(t, own, tg.Prefix, throttle.Concurrency{Limit: 1, Lease: 10 * time.Second})
	ctx := context.Background()
	held, _, err := holder.Acquire(ctx, "k")
	if err != nil || held == nil {
		t.Fatalf("Acquire: %v, %v", held, err)
	}
	got := make(chan *throttle.Lease, 1)
	go func() {
		l, err := waiter.AcquireWait(ctx, "k")
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	waitAhead(t, holder, "k", 1)
	// The waiter's limiter listens on the key's channel of its own.
	channels := holder.Key("k") + ":wake:*"
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if chs, err := tg.Client.PubSubChannels(ctx, channels).Result(); err == nil && len(chs) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiter never listened on its key's channel")
		}
	}
	before := calls.total()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l := <-got
	if l == nil {
		t.FailNow()
	}
	defer l.Release(ctx)
	if asked := calls.total() - before; asked != 0 {
		t.Errorf("the waiter asked %d more times after the release; want none: the release hands it the slot", asked)
	}
	if again, _, err := holder.Acquire(ctx, "k"); err != nil || again != nil {
		t.Errorf("Acquire while the slot is the waiter's: %v, %v; want none", again, err)
	}
}

// TestHandedOverLeaseOutlivesTheKey: a slot handed over 2 s into the
// holder's lease keeps the holders' key alive for the new holder's whole
// lease, not the 8 s the old one had left.
func TestHandedOverLeaseOutlivesTheKey(t *testing.T) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	c := capOf(t, tg, 1) // leases of 10 s
	ctx := context.Background()
	held, _, err := c.Acquire(ctx, "k")
	if err != nil || held == nil {
		t.Fatalf("Acquire: %v, %v", held, err)
	}
	got := make(chan *throttle.Lease, 1)
	go func() {
		l, _ := c.AcquireWait(ctx, "k")
		got <- l
	}()
	waitAhead(t, c, "k", 1)
	clock.Advance(2 * time.Second) // within the waiter's entry (3 s unless shown again)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Read at once: the release handed the slot over, before the new
	// holder's first renewal.
	ttl := tg.Mini.TTL(c.Key("k"))
	if l := <-got; l == nil {
		t.FailNow()
	} else {
		defer l.Release(ctx)
	}
	if ttl < 9*time.Second {
		t.Errorf("the holders' key expires in %s after the hand-over; want the new lease's 10 s", ttl)
	}
}

// parkingCap returns a cap of 1 slot on its own client to tg, a function
// that returns the payloads its releases called back so far, and one that
// counts the script calls of its client.
func parkingCap(t *testing.T, tg *redistest.Target) (c *throttle.ConcurrencyLimiter, called func() []string, scripts func() int) {
	t.Helper()
	counter := &commandCounter{count: map[string]int{}}
	client := tg.NewClient(t)
	client.AddHook(counter)
	c = newConcurrency(t, client, tg.Prefix, throttle.Concurrency{Limit: 1, Lease: 10 * time.Second})
	var mu sync.Mutex
	var calls []string
	workergate.OnCapCall(c, func(ps []string) { mu.Lock(); calls = append(calls, ps...); mu.Unlock() }, nil)
	called = func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(calls)
	}
	scripts = func() int {
		counter.mu.Lock()
		defer counter.mu.Unlock()
		return counter.count["evalsha"] + counter.count["eval"]
	}
	return c, called, scripts
}

// awaySettled is a little more than concurrency.lua's AWAY_SETTLE (120 ms):
// how long after the line parks a waiter its task is taken to be on its
// way back to asynq, during which a release calls it back only later.
const awaySettled = 150 * time.Millisecond

// parkAs returns what a worker's waiter w would park with.
func parkAs(w string) *workergate.CapParking {
	return &workergate.CapParking{Payload: "payload-" + w, TTL: time.Minute}
}

// TestRefusedWaiterParksInOneCall: a waiter the worker may park, refused
// with someone waiting ahead of it and no budget to wait, is parked by the
// call that refused it (one script call in all), and a release calls it
// back like one parked on its own; before any hold was seen, it stands in
// line to wait its budget (it cannot tell how long the wait would be), and
// is parked when that runs out, with no call of its own: here at once, a
// budget of 0. A release keeps its process's holds with the line, for
// every process's waiters.
func TestRefusedWaiterParksInOneCall(t *testing.T) {
	tg := redistest.New(t)
	c, called, scripts := parkingCap(t, tg)
	ctx := context.Background()

	held, _, _, err := workergate.CapWait(ctx, c, "k", "w0", 0, parkAs("w0"))
	if err != nil || held == nil {
		t.Fatalf("CapWait on a free slot: %v, %v", held, err)
	}
	before := scripts()
	if l, ahead, parked, err := workergate.CapWait(ctx, c, "k", "w1", 0, parkAs("w1")); err != nil || l != nil || !parked || ahead != 0 {
		t.Fatalf("w1, before any hold was seen: %v, %d ahead, parked %v, %v; want it parked as its budget ran out", l, ahead, parked, err)
	}
	if n := scripts() - before; n != 1 {
		t.Errorf("w1 stood in line and parked in %d script calls, want 1", n)
	}
	// A hold seen (another key's), the next waiter refused behind w1 parks.
	warm, _, err := c.Acquire(ctx, "warm")
	if err != nil || warm == nil {
		t.Fatal(warm, err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}
	before = scripts()
	l, ahead, parked, err := workergate.CapWait(ctx, c, "k", "w2", 0, parkAs("w2"))
	if err != nil || l != nil || !parked || ahead != 1 {
		t.Fatalf("w2: %v, %d ahead, parked %v, %v; want parked behind 1", l, ahead, parked, err)
	}
	if n := scripts() - before; n != 1 {
		t.Errorf("w2 was refused and parked in %d script calls, want 1", n)
	}
	// The release calls w2 back, a slot's worth of holders ahead; not w1,
	// parked a moment ago, whose task is still on its way back to asynq.
	if err := held.(*throttle.Lease).Release(ctx); err != nil {
		t.Fatal(err)
	}
	if calls := called(); len(calls) != 1 || calls[0] != "payload-w2" {
		t.Errorf("calls after the release: %q; want w2's payload", calls)
	}

	// w1, back, comes for the freed slot, first in line.
	if l, _, _, err := workergate.CapWait(ctx, c, "k", "w1", 0, parkAs("w1")); err != nil || l == nil {
		t.Fatalf("w1, back to a free slot: %v, %v; want the slot", l, err)
	}
	// That release, with a waiter in line, left its process's holds with
	// the line: a process that has seen none parks by them.
	other := newConcurrency(t, tg.NewClient(t), tg.Prefix, throttle.Concurrency{Limit: 1, Lease: 10 * time.Second})
	workergate.OnCapCall(other, func([]string) {}, nil)
	if l, _, parked, err := workergate.CapWait(ctx, other, "k", "w3", 0, parkAs("w3")); err != nil || l != nil || !parked {
		t.Errorf("w3, in a process that saw no hold: %v, parked %v, %v; want parked by the line's holds", l, parked, err)
	}
}

// TestReleaseMovesTheCalledTask: a release that calls parked waiters back
// moves each one's task to the head of its queue in the same call when it
// was prepared for them (a wait's reply listed them near the head of the
// line): that task is pending, at the head, and its payload is not handed
// to the call function; a task still running (not back in its queue yet)
// is left to the call function, as without preparing.
func TestReleaseMovesTheCalledTask(t *testing.T) {
	tg := redistest.New(t)
	c := capOf(t, tg, 1)
	ctx := context.Background()
	base := tg.Prefix + "asynq:{k}:" // asynq's keys, in the slot of the cap's key "k"
	keysOf := func(id string) []string {
		return []string{base + "retry", base + "scheduled", base + "pending", base + "t:" + id}
	}
	var calls []string
	workergate.OnCapCall(c, func(ps []string) { calls = append(calls, ps...) }, func(p string) (string, []string, bool) {
		return p, keysOf(p), true
	})
	if err := tg.Client.ZAdd(ctx, base+"retry", redis.Z{Score: 1, Member: "back"}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := tg.Client.HSet(ctx, base+"t:back", "state", "retry").Err(); err != nil {
		t.Fatal(err)
	}
	if err := tg.Client.HSet(ctx, base+"t:running", "state", "active").Err(); err != nil {
		t.Fatal(err)
	}
	held, _, _, err := workergate.CapWait(ctx, c, "k", "w0", 0, nil)
	if err != nil || held == nil {
		t.Fatalf("CapWait on a free slot: %v, %v", held, err)
	}
	for _, wt := range [][2]string{{"w1", "back"}, {"w2", "running"}} {
		w, task := wt[0], wt[1]
		park := &workergate.CapParking{Payload: task, TTL: time.Minute}
		if l, _, parked, err := workergate.CapWait(ctx, c, "k", w, 0, park); err != nil || l != nil || !parked {
			t.Fatalf("CapWait(%s) with the slot held: %v, parked %v, %v; want it parked in line", w, l, parked, err)
		}
	}
	time.Sleep(awaySettled) // on the Redis clock, which a real server's tests cannot drive
	// A third waiter stands in line: its wait's reply lists w1 and w2.
	if l, _, _, err := workergate.CapWait(ctx, c, "k", "w3", 0, nil); err != nil || l != nil {
		t.Fatalf("CapWait(w3) with the slot held: %v, %v; want it in line", l, err)
	}
	if err := held.(*throttle.Lease).Release(ctx); err != nil {
		t.Fatal(err)
	}
	if len(calls) != 1 || calls[0] != "running" {
		t.Errorf("calls after the release: %q; want only the running task's payload", calls)
	}
	pending, err := tg.Client.LRange(ctx, base+"pending", 0, -1).Result()
	if err != nil || len(pending) != 1 || pending[0] != "back" {
		t.Errorf("pending after the release: %q, %v; want the parked task moved there", pending, err)
	}
	if state := tg.Client.HGet(ctx, base+"t:back", "state").Val(); state != "pending" {
		t.Errorf("the moved task's state: %q, want pending", state)
	}
	if n := tg.Client.ZCard(ctx, base+"retry").Val(); n != 0 {
		t.Errorf("%d tasks left in retry, want 0", n)
	}
}

// TestHandedOverHolderPreparesItsRelease: the message that hands a freed
// slot to an inline waiter also names the parked waiters near the head of
// the line that release did not call, so that the new holder's own
// release, a hold later, moves the next one's task in the same call (here
// the holder's process made no other call that could have listed it).
func TestHandedOverHolderPreparesItsRelease(t *testing.T) {
	tg := redistest.New(t)
	c := capOf(t, tg, 1)
	away := newConcurrency(t, tg.NewClient(t), tg.Prefix, throttle.Concurrency{Limit: 1, Lease: 10 * time.Second})
	ctx := context.Background()
	base := tg.Prefix + "asynq:{k}:"
	keysOf := func(id string) []string {
		return []string{base + "retry", base + "scheduled", base + "pending", base + "t:" + id}
	}
	var mu sync.Mutex
	var calls []string
	workergate.OnCapCall(c, func(ps []string) { mu.Lock(); calls = append(calls, ps...); mu.Unlock() }, func(p string) (string, []string, bool) {
		return p, keysOf(p), true
	})
	workergate.OnCapCall(away, func([]string) {}, nil)
	for _, id := range []string{"task-1", "task-2"} {
		if err := tg.Client.ZAdd(ctx, base+"retry", redis.Z{Score: 1, Member: id}).Err(); err != nil {
			t.Fatal(err)
		}
		if err := tg.Client.HSet(ctx, base+"t:"+id, "state", "retry").Err(); err != nil {
			t.Fatal(err)
		}
	}
	held, _, _, err := workergate.CapWait(ctx, c, "k", "w0", 0, nil)
	if err != nil || held == nil {
		t.Fatalf("CapWait on a free slot: %v, %v", held, err)
	}
	// wA waits inline, in this process; p1 and p2 park behind it, in another.
	got := make(chan any, 1)
	go func() {
		l, _, _, err := workergate.CapWait(ctx, c, "k", "wA", 10*time.Second, nil)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	for {
		if n, err := tg.Client.ZCard(ctx, c.Key("k")+":line").Result(); err != nil || n == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	for i, w := range []string{"p1", "p2"} {
		park := &workergate.CapParking{Payload: []string{"task-1", "task-2"}[i], TTL: time.Minute}
		if l, _, parked, err := workergate.CapWait(ctx, away, "k", w, 0, park); err != nil || l != nil || !parked {
			t.Fatalf("CapWait(%s): %v, parked %v, %v; want it parked in line", w, l, parked, err)
		}
	}
	time.Sleep(awaySettled)
	// w0's release hands the slot to wA and calls p1 (not prepared: its
	// payload comes back); its message names p2.
	if err := held.(*throttle.Lease).Release(ctx); err != nil {
		t.Fatal(err)
	}
	lA := <-got
	if lA == nil {
		t.Fatal("wA got no slot")
	}
	// wA's release calls p2, and moves its task.
	if err := lA.(*throttle.Lease).Release(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 1 || calls[0] != "task-1" {
		t.Errorf("calls: %q; want only task-1's (w0's release was not prepared for it)", calls)
	}
	if pending := tg.Client.LRange(ctx, base+"pending", 0, -1).Val(); len(pending) != 1 || pending[0] != "task-2" {
		t.Errorf("pending: %q; want task-2, moved by wA's release", pending)
	}
}

// TestWaiterParksWhenItsBudgetRunsOut: a waiter the worker may park waits
// in line for its budget and is parked by Redis when the budget runs out,
// with no call of its own: it returns parked after its one call. A release
// in the next 120 ms (concurrency.lua's AWAY_SETTLE: its task is on its way
// back to asynq) does not hand it the slot, and calls it back 120 ms later.
// A release before its budget runs out hands it the slot. A waiter handed a slot that it
// did not take up (it had gone) takes the slot when it waits again.
func TestWaiterParksWhenItsBudgetRunsOut(t *testing.T) {
	tg := redistest.New(t)
	c, called, scripts := parkingCap(t, tg)
	ctx := context.Background()
	held, _, _, err := workergate.CapWait(ctx, c, "k", "w0", 0, parkAs("w0"))
	if err != nil || held == nil {
		t.Fatalf("CapWait on a free slot: %v, %v", held, err)
	}

	// Parked as its budget runs out, in one call; then called back.
	before := scripts()
	l, _, parked, err := workergate.CapWait(ctx, c, "k", "w1", 200*time.Millisecond, parkAs("w1"))
	if err != nil || l != nil || !parked {
		t.Fatalf("w1 after its budget: %v, parked %v, %v; want parked", l, parked, err)
	}
	if n := scripts() - before; n != 1 {
		t.Errorf("w1 waited and parked in %d script calls, want 1", n)
	}
	if err := held.(*throttle.Lease).Release(ctx); err != nil {
		t.Fatal(err)
	}
	if calls := called(); len(calls) != 0 {
		t.Errorf("calls at once after a release just after w1 parked: %q; want none", calls)
	}
	time.Sleep(250 * time.Millisecond) // the call comes 120 ms after the release
	if calls := called(); len(calls) != 1 || calls[0] != "payload-w1" {
		t.Errorf("calls 250 ms after that release: %q; want w1's payload", calls)
	}

	// Handed the slot by a release within its budget.
	k2, _, _, err := workergate.CapWait(ctx, c, "k2", "x0", 0, parkAs("x0"))
	if err != nil || k2 == nil {
		t.Fatalf("CapWait on a free slot: %v, %v", k2, err)
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		_ = k2.(*throttle.Lease).Release(ctx)
	}()
	got, _, parked, err := workergate.CapWait(ctx, c, "k2", "x1", 5*time.Second, parkAs("x1"))
	if err != nil || got == nil || parked {
		t.Fatalf("x1, a slot freed within its budget: %v, parked %v, %v; want the slot", got, parked, err)
	}

	// A slot handed to a waiter that had gone (its entry says granted, to
	// a holder that never came) is the waiter's when it waits again.
	holders := c.Key("k3")
	old := fmt.Sprint(time.Now().Add(10 * time.Second).UnixMicro())
	if err := tg.Client.ZAdd(ctx, holders, redis.Z{Score: float64(time.Now().Add(10 * time.Second).UnixMicro()), Member: "gone-holder"}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := tg.Client.HSet(ctx, holders+keyspace.WaitersSuffix, "y1", old+"|g|gone-holder").Err(); err != nil {
		t.Fatal(err)
	}
	y1, _, _, err := workergate.CapWait(ctx, c, "k3", "y1", 0, parkAs("y1"))
	if err != nil || y1 == nil {
		t.Fatalf("y1, handed a slot it did not take up: %v, %v; want the slot", y1, err)
	}
	members, err := tg.Client.ZRange(ctx, holders, 0, -1).Result()
	if err != nil || len(members) != 1 || members[0] == "gone-holder" {
		t.Errorf("holders after y1 took its slot: %q, %v; want y1's holder alone", members, err)
	}
	// A slot handed over whose lease ran out is nobody's: a waiter that
	// comes back to such an entry while another holds the slot waits.
	k4, _, _, err := workergate.CapWait(ctx, c, "k4", "z0", 0, parkAs("z0"))
	if err != nil || k4 == nil {
		t.Fatalf("CapWait on a free slot: %v, %v", k4, err)
	}
	if err := tg.Client.HSet(ctx, c.Key("k4")+keyspace.WaitersSuffix, "z1", old+"|g|lapsed-holder").Err(); err != nil {
		t.Fatal(err)
	}
	if z1, _, _, err := workergate.CapWait(ctx, c, "k4", "z1", 0, parkAs("z1")); err != nil || z1 != nil {
		t.Errorf("z1, whose handed slot lapsed, with the slot held: %v, %v; want no slot", z1, err)
	}
}
