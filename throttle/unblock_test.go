package throttle_test

import (
	"context"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// TestUnblock: Unblock lifts a block at once; a window policy and a
// LeakyBucket keep what was consumed before, TokenBucket and GCRA (which
// keep the block in their state) start afresh; a key without a block is
// left as it is.
func TestUnblock(t *testing.T) {
	keepsCount := map[string]bool{"FixedWindow": true, "SlidingLog": true, "SlidingWindow": true, "LeakyBucket": true}
	for _, a := range algorithms() {
		t.Run(a.name, func(t *testing.T) {
			tg := redistest.Embedded(t)
			tg.Clock(t)
			l := newLimiter(t, tg, a.policy)
			ctx := context.Background()
			allowN(t, l, "k", 2)
			before := peek(t, l, "k")
			// Without a block, Unblock changes nothing.
			if err := l.Unblock(ctx, "k"); err != nil {
				t.Fatal(err)
			}
			if r := peek(t, l, "k"); r != before {
				t.Fatalf("Unblock without a block changed the key: %+v, was %+v", r, before)
			}
			if err := l.BlockFor(ctx, "k", time.Hour); err != nil {
				t.Fatal(err)
			}
			if r := peek(t, l, "k"); r.Allowed {
				t.Fatalf("blocked, Peek admits: %+v", r)
			}
			if err := l.Unblock(ctx, "k"); err != nil {
				t.Fatal(err)
			}
			if left, err := l.BlockedFor(ctx, "k"); err != nil || left != 0 {
				t.Fatalf("BlockedFor after Unblock: %s, %v", left, err)
			}
			r := peek(t, l, "k")
			if !r.Allowed {
				t.Fatalf("after Unblock: %+v, want admitted", r)
			}
			if want := r.Limit - 2; keepsCount[a.name] && r.Remaining != want {
				t.Errorf("after Unblock, %d remaining; want %d: what was consumed before the block counts", r.Remaining, want)
			}
			if !keepsCount[a.name] && r.Remaining != r.Limit {
				t.Errorf("after Unblock, %d remaining; want %d: the state is forgotten", r.Remaining, r.Limit)
			}
			if err := l.Unblock(ctx, ""); err == nil {
				t.Error("Unblock of an empty key: no error")
			}
		})
	}
}
