package throttle_test

import (
	"fmt"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"golang.org/x/time/rate"
)

// TestTokenBucketAgreesWithXTimeRate compares TokenBucket with
// golang.org/x/time/rate's Limiter, the token bucket most Go code uses,
// request by request at the same instants.
func TestTokenBucketAgreesWithXTimeRate(t *testing.T) {
	for _, tc := range []struct {
		rate  throttle.Rate
		burst int
	}{
		{throttle.PerSecond(10), 1},
		{throttle.PerSecond(10), 10},
		{throttle.Rate{N: 3, Per: time.Second}, 5},
		{throttle.PerMinute(100), 20},
		{throttle.Rate{N: 7, Per: 3 * time.Second}, 4},
		{throttle.PerSecond(1000), 50},
	} {
		t.Run(fmt.Sprintf("%s_burst_%d", tc.rate, tc.burst), func(t *testing.T) {
			compareWithXRate(t, tc.rate, tc.burst, 600, rand.New(rand.NewPCG(uint64(tc.rate.N), uint64(tc.burst))))
		})
	}
}

// compareWithXRate drives TokenBucket and x/time/rate through the same
// random requests. x/time/rate keeps its tokens in a float64, so at an
// instant where the exact token count equals the request the two may differ
// by rounding; such a disagreement is accepted only when the exact count is
// within 1e-9 of the request, must stay rare, and starts both afresh.
func compareWithXRate(t *testing.T, r throttle.Rate, burst, steps int, rng *rand.Rand) {
	t.Helper()
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	l := newLimiter(t, tg, throttle.TokenBucket{Rate: r, Burst: burst})
	limit := rate.Limit(float64(r.N) / r.Per.Seconds())
	ref := rate.NewLimiter(limit, burst)
	exact := newTokenBucketModel(r.N, r.Per, burst)
	key := "k"
	interval := r.Per.Microseconds() / int64(r.N)
	var agreed, rounding int
	for i := range steps {
		clock.Advance(time.Duration(rng.Int64N(2*interval+1)) * time.Microsecond)
		n := 1 + rng.IntN(burst)
		tokens := new(big.Rat).Set(exact.refill(clock.Now().UnixMicro()))
		got := allowN(t, l, key, n)
		want := ref.AllowN(clock.Now(), n)
		exact.decide(clock.Now().UnixMicro(), int64(n), true)
		if got.Allowed == want {
			agreed++
			continue
		}
		gap, _ := new(big.Rat).Sub(tokens, big.NewRat(int64(n), 1)).Float64()
		if gap < -1e-9 || gap > 1e-9 {
			t.Fatalf("step %d, n=%d, exact tokens %s: TokenBucket allowed=%v, x/time/rate allowed=%v",
				i, n, tokens.FloatString(12), got.Allowed, want)
		}
		rounding++
		key, ref, exact = "k"+itoa(i), rate.NewLimiter(limit, burst), newTokenBucketModel(r.N, r.Per, burst)
	}
	if rounding*100 > steps {
		t.Fatalf("%d of %d decisions differ by float rounding; expected it to be rare", rounding, steps)
	}
	t.Logf("%d decisions agreed, %d differed at exact boundaries by float rounding", agreed, rounding)
}
