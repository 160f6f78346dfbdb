package throttle_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// Behaviour particular to one algorithm, on a driven clock.

func TestFixedWindowAdmitsTwiceTheLimitAcrossABoundary(t *testing.T) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	l := newLimiter(t, tg, throttle.FixedWindow{Limit: 10, Window: time.Second})
	// One millisecond before a whole second: the end of a window.
	clock.Set(clock.Now().Truncate(time.Second).Add(2*time.Second - time.Millisecond))
	if r := allowN(t, l, "k", 10); !r.Allowed || r.RetryAfter != 0 || r.ResetAfter != time.Millisecond {
		t.Fatalf("first burst: %+v, want allowed, resetting in 1ms", r)
	}
	if r := allowN(t, l, "k", 1); r.Allowed || r.RetryAfter != time.Millisecond {
		t.Fatalf("11th in the window: %+v, want rejected for 1ms", r)
	}
	clock.Advance(time.Millisecond)
	if r := allowN(t, l, "k", 10); !r.Allowed || r.ResetAfter != time.Second {
		t.Fatalf("burst in the new window: %+v, want allowed", r)
	}
	// 20 units within 1ms: the documented price of fixed windows.
}

func TestSlidingLogNeverExceedsTheLimitInAnyWindow(t *testing.T) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	const limit, window = 7, time.Second
	l := newLimiter(t, tg, throttle.SlidingLog{Limit: limit, Window: window})
	rng := rand.New(rand.NewPCG(7, 7))
	var admitted []int64 // server time of every admitted unit
	for range 2000 {
		clock.Advance(time.Duration(rng.Int64N(60_000)) * time.Microsecond)
		n := 1 + rng.IntN(3)
		if r := allowN(t, l, "k", n); r.Allowed {
			for range n {
				admitted = append(admitted, throttle.ServerTime(r))
			}
		}
	}
	if len(admitted) < 100 {
		t.Fatalf("only %d units admitted: the walk does not exercise the limit", len(admitted))
	}
	// The window ending at each admission holds at most limit units.
	w := window.Microseconds()
	for i, end := range admitted {
		count := 0
		for _, at := range admitted[:i+1] {
			if at > end-w {
				count++
			}
		}
		if count > limit {
			t.Fatalf("%d units in the window ending at %d µs, limit %d", count, end, limit)
		}
	}
	checkTTLs(t, tg)
	// Memory is bounded by the limit: old entries are trimmed.
	if n, err := tg.Client.ZCard(t.Context(), l.Key("k")).Result(); err != nil || n > limit {
		t.Fatalf("the log holds %d entries (%v), want at most %d", n, err, limit)
	}
}

func TestSlidingWindowWeighsThePreviousWindow(t *testing.T) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	l := newLimiter(t, tg, throttle.SlidingWindow{Limit: 10, Window: time.Second})
	start := clock.Now().Truncate(time.Second).Add(time.Second)
	clock.Set(start.Add(100 * time.Millisecond))
	allowN(t, l, "k", 10) // the whole limit in one window
	// A quarter into the next window, 75% of it still counts: 7.5 of 10.
	clock.Set(start.Add(1250 * time.Millisecond))
	if r := peek(t, l, "k"); r.Remaining != 2 {
		t.Fatalf("a quarter into the next window: %+v, want 2 remaining (10 − 7.5)", r)
	}
	allowN(t, l, "k", 2)
	r := allowN(t, l, "k", 1)
	// 10·(1 − e) + 2 + 1 <= 10 when e >= 0.3: 50 ms from now.
	if r.Allowed || r.RetryAfter != 50*time.Millisecond || r.ResetAfter != 1750*time.Millisecond {
		t.Fatalf("got %+v, want rejected, RetryAfter 50ms, ResetAfter 1.75s", r)
	}
	clock.Advance(r.RetryAfter)
	if r := allowN(t, l, "k", 1); !r.Allowed {
		t.Fatalf("at RetryAfter: %+v", r)
	}
}

func TestMetersAgreeWithEachOther(t *testing.T) {
	// TokenBucket, LeakyBucket and GCRA of the same rate and capacity are
	// three descriptions of one meter: the same sequence gets the same
	// answers from all three.
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	rate := throttle.Rate{N: 7, Per: 3 * time.Second}
	ls := []*throttle.Limiter{
		newLimiter(t, tg, throttle.TokenBucket{Rate: rate, Burst: 4}),
		newLimiter(t, tg, throttle.LeakyBucket{Rate: rate, Capacity: 4}),
		newLimiter(t, tg, throttle.GCRA{Rate: rate, Burst: 4}),
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 500 {
		clock.Advance(time.Duration(rng.Int64N(500_000)) * time.Microsecond)
		n := 1 + rng.IntN(4)
		var first throttle.Result
		for j, l := range ls {
			r := allowN(t, l, "k", n)
			if j == 0 {
				first = r
			} else if asDecision(r) != asDecision(first) {
				t.Fatalf("step %d: %s says %+v, %s says %+v", i, describe(ls[0].Policy()), first, describe(l.Policy()), r)
			}
		}
	}
}

// TestSlidingLogLargestRequest: the largest SlidingLog (10,000) takes and
// gives back a full request exactly; the figures line reports how long one
// such script held Redis, measured by a PING sent meanwhile from another
// connection (a SlidingLog of 2,000,000, refused since, held it 3.6–6.1 s).
func TestSlidingLogLargestRequest(t *testing.T) {
	tg := redistest.New(t)
	const limit = 10_000
	l := newLimiter(t, tg, throttle.SlidingLog{Limit: limit, Window: time.Minute})
	ctx := context.Background()
	other := tg.NewClient(t)
	var pingWorst time.Duration
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 50 {
			start := time.Now()
			_ = other.Ping(ctx).Err()
			pingWorst = max(pingWorst, time.Since(start))
		}
	}()
	start := time.Now()
	res, err := l.Reserve(ctx, "bulk", limit, 0)
	took := time.Since(start)
	<-done
	if err != nil || !res.OK {
		t.Fatalf("Reserve of the whole limit: %+v, %v", res, err)
	}
	if r := allowN(t, l, "bulk", 1); r.Allowed {
		t.Fatalf("one more unit after the whole limit: %+v", r)
	}
	if err := res.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	if r := peek(t, l, "bulk"); !r.Allowed || r.Remaining != limit {
		t.Fatalf("after cancelling the whole limit: %+v; want it all free", r)
	}
	t.Logf("figures: %s: a request for 10,000 units of a SlidingLog took %s; a PING from another connection meanwhile, at worst %s",
		tg.Kind, took.Round(100*time.Microsecond), pingWorst.Round(100*time.Microsecond))
}
