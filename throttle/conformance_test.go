package throttle_test

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// TestConformance runs the same scenarios against every algorithm on an
// embedded Redis whose clock the test drives.
func TestConformance(t *testing.T) {
	cases := []struct {
		name string
		run  func(t *testing.T, a algorithm, capacity int)
	}{
		{"BurstThenReject", conformBurstThenReject},
		{"RejectionConsumesNothing", conformRejectionConsumesNothing},
		{"RetryAfterIsExact", conformRetryAfterIsExact},
		{"PeekConsumesNothing", conformPeekConsumesNothing},
		{"Reset", conformReset},
		{"ResetAfterAndExpiry", conformResetAfterAndExpiry},
		{"PoliciesDoNotShareState", conformPoliciesDoNotShareState},
		{"BadRequests", conformBadRequests},
		{"AgreesWithModel", conformAgreesWithModel},
		{"AgreesWithModelIn2199", conformAgreesWithModelFarFuture},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, a := range algorithms() {
				t.Run(a.name, func(t *testing.T) { c.run(t, a, 5) })
			}
		})
	}
}

func conformBurstThenReject(t *testing.T, a algorithm, capacity int) {
	tg := redistest.Embedded(t)
	tg.Clock(t)
	l := newLimiter(t, tg, a.policy)
	for i := range capacity {
		r := allowN(t, l, "k", 1)
		if !r.Allowed || r.Remaining != capacity-1-i || r.Limit != capacity || r.RetryAfter != 0 {
			t.Fatalf("request %d: got %+v, want allowed with %d remaining", i+1, r, capacity-1-i)
		}
	}
	r := allowN(t, l, "k", 1)
	if r.Allowed || r.Remaining != 0 || r.RetryAfter <= 0 || r.ResetAfter <= 0 {
		t.Fatalf("request %d: got %+v, want rejected with a positive RetryAfter", capacity+1, r)
	}
	checkTTLs(t, tg)
}

func conformRejectionConsumesNothing(t *testing.T, a algorithm, capacity int) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	l := newLimiter(t, tg, a.policy)
	allowN(t, l, "k", capacity)
	first := allowN(t, l, "k", 1)
	for range 100 {
		if r := allowN(t, l, "k", 1); r.Allowed || r.RetryAfter != first.RetryAfter {
			t.Fatalf("a flood of rejections changed the answer: first %+v, now %+v", first, r)
		}
	}
	if r := peek(t, l, "k"); r.RetryAfter != first.RetryAfter || r.ResetAfter != first.ResetAfter {
		t.Fatalf("after the flood Peek says %+v, the first rejection said %+v", r, first)
	}
	clock.Advance(first.RetryAfter)
	if r := allowN(t, l, "k", 1); !r.Allowed {
		t.Fatalf("at RetryAfter (%s) after 100 rejections: %+v, want allowed", first.RetryAfter, r)
	}
}

func conformRetryAfterIsExact(t *testing.T, a algorithm, capacity int) {
	for _, n := range []int{1, 2, capacity} {
		tg := redistest.Embedded(t)
		clock := tg.Clock(t)
		l := newLimiter(t, tg, a.policy)
		allowN(t, l, "k", capacity)
		r := allowN(t, l, "k", n)
		if r.Allowed || r.RetryAfter < time.Millisecond {
			t.Fatalf("n=%d on an exhausted key: %+v, want rejected for at least 1ms", n, r)
		}
		if a.exactRetry {
			clock.Advance(r.RetryAfter - time.Millisecond)
			if early := allowN(t, l, "k", n); early.Allowed {
				t.Fatalf("n=%d admitted 1ms before RetryAfter %s", n, r.RetryAfter)
			}
			clock.Advance(time.Millisecond - time.Microsecond)
			if early := allowN(t, l, "k", n); early.Allowed {
				t.Fatalf("n=%d admitted 1µs before RetryAfter %s", n, r.RetryAfter)
			}
			clock.Advance(time.Microsecond)
		} else {
			clock.Advance(r.RetryAfter)
		}
		if late := allowN(t, l, "k", n); !late.Allowed {
			t.Fatalf("n=%d not admitted at RetryAfter %s: %+v", n, r.RetryAfter, late)
		}
	}
}

func conformPeekConsumesNothing(t *testing.T, a algorithm, capacity int) {
	tg := redistest.Embedded(t)
	tg.Clock(t)
	l := newLimiter(t, tg, a.policy)
	for range 20 {
		if r := peek(t, l, "k"); !r.Allowed || r.Remaining != capacity || r.ResetAfter != 0 {
			t.Fatalf("Peek on a fresh key: %+v, want allowed with %d remaining", r, capacity)
		}
	}
	if keys := tg.Keys(t); len(keys) != 0 {
		t.Fatalf("Peek wrote keys: %v", keys)
	}
	allowN(t, l, "k", 2)
	for range 5 {
		if r := peek(t, l, "k"); r.Remaining != capacity-2 {
			t.Fatalf("Peek after taking 2: %+v, want %d remaining", r, capacity-2)
		}
	}
	allowN(t, l, "k", capacity-2)
	p := peek(t, l, "k")
	r := allowN(t, l, "k", 1)
	if p.Allowed || r.Allowed || p.RetryAfter != r.RetryAfter {
		t.Fatalf("Peek %+v and Allow %+v disagree on an exhausted key", p, r)
	}
}

func conformReset(t *testing.T, a algorithm, capacity int) {
	tg := redistest.Embedded(t)
	tg.Clock(t)
	l := newLimiter(t, tg, a.policy)
	allowN(t, l, "k", capacity)
	allowN(t, l, "other", 1)
	if err := l.Reset(t.Context(), "k"); err != nil {
		t.Fatal(err)
	}
	if r := allowN(t, l, "k", 1); !r.Allowed || r.Remaining != capacity-1 {
		t.Fatalf("after Reset: %+v, want a full key", r)
	}
	if r := peek(t, l, "other"); r.Remaining != capacity-1 {
		t.Fatalf("Reset of k touched another key: %+v", r)
	}
	if err := l.Reset(t.Context(), "never-used"); err != nil {
		t.Fatalf("Reset of an unknown key: %v", err)
	}
}

func conformResetAfterAndExpiry(t *testing.T, a algorithm, capacity int) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	l := newLimiter(t, tg, a.policy)
	allowN(t, l, "k", capacity)
	r := peek(t, l, "k")
	checkTTLs(t, tg)
	clock.Advance(r.ResetAfter)
	if full := peek(t, l, "k"); full.Remaining != capacity || full.ResetAfter != 0 {
		t.Fatalf("at ResetAfter (%s): %+v, want full capacity", r.ResetAfter, full)
	}
	// Expiries are whole milliseconds, rounded up: gone a millisecond later.
	clock.Advance(time.Millisecond)
	if keys := tg.Keys(t); len(keys) != 0 {
		t.Fatalf("keys left 1ms after ResetAfter: %v", keys)
	}
}

func conformPoliciesDoNotShareState(t *testing.T, a algorithm, capacity int) {
	tg := redistest.Embedded(t)
	tg.Clock(t)
	l := newLimiter(t, tg, a.policy)
	var other algorithm
	for _, o := range algorithmsWith(capacity+1, 2*time.Second, throttle.Rate{N: 3, Per: 2 * time.Second}) {
		if o.name == a.name {
			other = o
		}
	}
	m := newLimiter(t, tg, other.policy)
	if l.Key("k") == m.Key("k") {
		t.Fatalf("two policies share the key %s", l.Key("k"))
	}
	allowN(t, l, "k", capacity)
	if r := peek(t, m, "k"); r.Remaining != capacity+1 {
		t.Fatalf("exhausting %s drained %s: %+v", describe(a.policy), describe(other.policy), r)
	}
}

func conformBadRequests(t *testing.T, a algorithm, capacity int) {
	tg := redistest.Embedded(t)
	tg.Clock(t)
	l := newLimiter(t, tg, a.policy)
	ctx := t.Context()
	for _, tc := range []struct {
		key  string
		n    int
		want error
	}{
		{"", 1, throttle.ErrInvalidKey},
		{"k", 0, throttle.ErrInvalidN},
		{"k", -1, throttle.ErrInvalidN},
		{"k", capacity + 1, throttle.ErrExceedsLimit},
		{"k", 1 << 40, throttle.ErrExceedsLimit},
	} {
		if _, err := l.AllowN(ctx, tc.key, tc.n); !errors.Is(err, tc.want) {
			t.Errorf("AllowN(%q, %d) = %v, want %v", tc.key, tc.n, err, tc.want)
		}
	}
	if _, err := l.Peek(ctx, ""); !errors.Is(err, throttle.ErrInvalidKey) {
		t.Errorf("Peek(\"\") = %v, want ErrInvalidKey", err)
	}
	if err := l.Reset(ctx, ""); !errors.Is(err, throttle.ErrInvalidKey) {
		t.Errorf("Reset(\"\") = %v, want ErrInvalidKey", err)
	}
	if keys := tg.Keys(t); len(keys) != 0 {
		t.Errorf("bad requests wrote keys: %v", keys)
	}
}

func conformAgreesWithModel(t *testing.T, a algorithm, capacity int) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	walkAgainstModel(t, tg, clock, a, capacity, 400, rand.New(rand.NewPCG(1, uint64(len(a.name)))))
}

func conformAgreesWithModelFarFuture(t *testing.T, a algorithm, capacity int) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	clock.Set(time.Date(2199, 12, 31, 23, 59, 58, 123456000, time.UTC))
	walkAgainstModel(t, tg, clock, a, capacity, 200, rand.New(rand.NewPCG(2, uint64(len(a.name)))))
}

// walkAgainstModel drives a random sequence of requests (n from 1 to
// capacity, one in ten a Peek), comparing every decision with the model and
// every key's expiry. Steps are random up to about two full refills, or land
// exactly on (or a microsecond either side of) the instant the previous
// answer named, where off-by-one errors live.
func walkAgainstModel(t *testing.T, tg *redistest.Target, clock *redistest.Clock, a algorithm, capacity, steps int, rng *rand.Rand) {
	t.Helper()
	l := newLimiter(t, tg, a.policy)
	m := a.model()
	span := 2 * int64(time.Second/time.Microsecond) / int64(capacity)
	var last throttle.Result
	for i := range steps {
		clock.Advance(nextStep(rng, last, span))
		n := 1 + rng.IntN(capacity)
		take := rng.IntN(10) != 0
		if !take {
			n = 1 // Peek asks about one unit
		}
		last = checkAgainstModel(t, l, m, "k", n, take, "step "+itoa(i))
		checkTTLs(t, tg)
	}
}

// nextStep picks the next clock step: random below span microseconds, or
// the previous answer's RetryAfter or ResetAfter, give or take 1µs.
func nextStep(rng *rand.Rand, last throttle.Result, span int64) time.Duration {
	target := last.RetryAfter
	if rng.IntN(2) == 0 {
		target = last.ResetAfter
	}
	if target <= 0 || rng.IntN(3) == 0 {
		return time.Duration(rng.Int64N(span)) * time.Microsecond
	}
	return max(0, target+time.Duration(rng.IntN(3)-1)*time.Microsecond)
}
