package throttle_test

import (
	"context"
	"slices"
	"testing"
	"time"

	workergate "github.com/jobthrottle/jobthrottle/internal/gate"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// TestLateHandOverCallsTheTaskBack: a slot handed to a waiter just before
// the line parks it, whose message reaches the waiter's process only after
// it stopped listening and went back to its queue, has its task called
// back at once (rather than held for it until asynq's own retry brings
// the task back), and the slot is the waiter's when it waits again. The
// late message is made by holding the embedded Redis's clock still: the
// waiter waits out its budget and its listening on the wall clock, while
// on the Redis clock its budget has not run out when the slot is freed.
func TestLateHandOverCallsTheTaskBack(t *testing.T) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	c, called, _ := parkingCap(t, tg)
	ctx := context.Background()

	held, _, _, err := workergate.CapWait(ctx, c, "k", "x0", 0, parkAs("x0"))
	if err != nil || held == nil {
		t.Fatalf("CapWait on a free slot: %v, %v", held, err)
	}
	l, _, parked, err := workergate.CapWait(ctx, c, "k", "x1", 50*time.Millisecond, parkAs("x1"))
	if err != nil || l != nil || !parked {
		t.Fatalf("x1 after its budget: %v, parked %v, %v; want parked", l, parked, err)
	}
	clock.Advance(30 * time.Millisecond) // x1's budget has 20 ms left, on the Redis clock
	if err := held.(*throttle.Lease).Release(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !slices.Contains(called(), "payload-x1") {
		if time.Now().After(deadline) {
			t.Fatalf("calls 5 s after x1 was handed a slot it had gone from: %q; want x1's payload", called())
		}
		time.Sleep(5 * time.Millisecond)
	}
	x1, _, _, err := workergate.CapWait(ctx, c, "k", "x1", 0, parkAs("x1"))
	if err != nil || x1 == nil {
		t.Fatalf("x1 back, the slot handed to it while it was away: %v, %v; want the slot", x1, err)
	}
	if err := x1.(*throttle.Lease).Release(ctx); err != nil {
		t.Fatal(err)
	}
	if calls := called(); len(calls) != 1 {
		t.Errorf("calls: %q; want x1's payload once", calls)
	}
}
