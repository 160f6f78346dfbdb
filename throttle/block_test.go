package throttle_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// TestBlockForHoldsEveryAlgorithm: a blocked key admits nothing until the
// block ends, to the microsecond, then admits again; Reset lifts a block.
func TestBlockForHoldsEveryAlgorithm(t *testing.T) {
	for _, a := range algorithms() {
		t.Run(a.name, func(t *testing.T) {
			tg := redistest.Embedded(t)
			clock := tg.Clock(t)
			l := newLimiter(t, tg, a.policy)
			ctx := context.Background()
			if err := l.BlockFor(ctx, "k", 2*time.Second); err != nil {
				t.Fatal(err)
			}
			// A shorter block does not shorten it.
			if err := l.BlockFor(ctx, "k", time.Second); err != nil {
				t.Fatal(err)
			}
			if r := peek(t, l, "k"); r.Allowed || r.RetryAfter != 2*time.Second || r.Remaining != 0 {
				t.Fatalf("Peek on a blocked key: %+v, want rejected for 2s", r)
			}
			if left, err := l.BlockedFor(ctx, "k"); err != nil || left != 2*time.Second {
				t.Fatalf("BlockedFor: %s, %v; want 2s", left, err)
			}
			clock.Advance(2*time.Second - time.Microsecond)
			if r := allowN(t, l, "k", 1); r.Allowed || r.RetryAfter != time.Microsecond {
				t.Fatalf("1µs before the block ends: %+v", r)
			}
			checkTTLs(t, tg)
			clock.Advance(time.Microsecond)
			if r := allowN(t, l, "k", 1); !r.Allowed {
				t.Fatalf("when the block ends: %+v, want admitted", r)
			}
			if left, err := l.BlockedFor(ctx, "k"); err != nil || left != 0 {
				t.Fatalf("BlockedFor after the block: %s, %v", left, err)
			}
			if err := l.BlockFor(ctx, "k", time.Hour); err != nil {
				t.Fatal(err)
			}
			if err := l.Reset(ctx, "k"); err != nil {
				t.Fatal(err)
			}
			if r := allowN(t, l, "k", 1); !r.Allowed {
				t.Fatalf("after Reset the block still holds: %+v", r)
			}
		})
	}
}

func TestReservationsStartAfterABlock(t *testing.T) {
	tg := redistest.Embedded(t)
	tg.Clock(t)
	l := newLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 5})
	ctx := context.Background()
	if err := l.BlockFor(ctx, "k", 3*time.Second); err != nil {
		t.Fatal(err)
	}
	for i, want := range []time.Duration{3 * time.Second, 3100 * time.Millisecond, 3200 * time.Millisecond} {
		res, err := l.Reserve(ctx, "k", 1, time.Minute)
		if err != nil || !res.OK || res.Delay != want {
			t.Fatalf("booking %d during a 3s block: %+v, %v; want a slot %s away", i, res, err, want)
		}
	}
}

func TestBlockForRejectsBadDurations(t *testing.T) {
	tg := redistest.Embedded(t)
	l := newLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(1), Burst: 1})
	for _, d := range []time.Duration{0, -time.Second, 11 * 365 * 24 * time.Hour} {
		if err := l.BlockFor(context.Background(), "k", d); !errors.Is(err, throttle.ErrInvalidDelay) {
			t.Errorf("BlockFor(%s): %v", d, err)
		}
	}
	if err := l.BlockFor(context.Background(), "", time.Second); !errors.Is(err, throttle.ErrInvalidKey) {
		t.Errorf("empty key: %v", err)
	}
}
