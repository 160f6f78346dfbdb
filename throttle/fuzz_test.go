package throttle_test

import (
	"encoding/binary"
	"math/big"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"golang.org/x/time/rate"
)

// fuzzShapes are the policy shapes the fuzz targets pick from: capacity,
// window or period, and the rate of the meters.
var fuzzShapes = []struct {
	capacity int
	window   time.Duration
	rate     throttle.Rate
}{
	{1, time.Millisecond, throttle.Rate{N: 1, Per: time.Millisecond}},
	{2, 10 * time.Millisecond, throttle.Rate{N: 3, Per: 10 * time.Millisecond}},
	{5, time.Second, throttle.Rate{N: 3, Per: time.Second}},
	{13, 1500 * time.Microsecond, throttle.Rate{N: 7, Per: 1500 * time.Microsecond}},
	{4, time.Minute, throttle.PerMinute(60)},
	{100, time.Second, throttle.PerSecond(1000)},
}

// fuzzStep is one request decoded from fuzz input: advance the clock, then
// take n units or peek.
type fuzzStep struct {
	advance time.Duration
	n       int
	take    bool
}

// decodeSteps turns bytes into steps, 3 bytes each: two for the clock step
// (scaled to the shape's period), one for n and the mode.
func decodeSteps(data []byte, capacity int, period time.Duration) []fuzzStep {
	var steps []fuzzStep
	for len(data) >= 3 && len(steps) < 300 {
		raw := binary.LittleEndian.Uint16(data)
		// Up to twice the period between requests, in whole microseconds.
		advance := time.Duration(int64(raw)*2*period.Microseconds()/65535) * time.Microsecond
		b := data[2]
		steps = append(steps, fuzzStep{advance: advance, n: 1 + int(b>>1)%capacity, take: b&1 == 0})
		data = data[3:]
	}
	return steps
}

func fuzzSeeds(f *testing.F) {
	f.Add(byte(0), byte(2), []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0})
	f.Add(byte(3), byte(3), []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18})
	f.Add(byte(5), byte(1), []byte{0xff, 0x10, 8, 0x00, 0x80, 9, 0x33, 0x33, 2, 0, 0, 4, 0, 0, 6})
	f.Add(byte(1), byte(5), []byte{0, 1, 0xfe, 0, 1, 0xfc, 0, 1, 0xfa, 0, 0x40, 3, 0x20, 0, 0})
	f.Add(byte(2), byte(4), []byte{0x80, 0, 2, 0x80, 0, 4, 0x80, 0, 6, 0x80, 0, 8, 0x10, 0x10, 1})
	f.Add(byte(4), byte(0), []byte{0, 0, 0, 0, 0, 2, 0xff, 0xff, 0, 0x55, 0x55, 0})
}

// FuzzScriptsMatchModels drives an algorithm's Lua and its reference model
// with the same sequence of (clock step, n, mode) and compares every
// decision.
func FuzzScriptsMatchModels(f *testing.F) {
	fuzzSeeds(f)
	tg := redistest.Embedded(f)
	clock := tg.Clock(f)
	keys := 0
	f.Fuzz(func(t *testing.T, which, shapeIndex byte, data []byte) {
		shape := fuzzShapes[int(shapeIndex)%len(fuzzShapes)]
		all := algorithmsWith(shape.capacity, shape.window, shape.rate)
		a := all[int(which)%len(all)]
		l := newLimiter(t, tg, a.policy)
		m := a.model()
		keys++
		key := "fuzz-" + itoa(keys)
		for i, s := range decodeSteps(data, shape.capacity, max(shape.window, shape.rate.Per)) {
			clock.Advance(s.advance)
			n := s.n
			if !s.take {
				n = 1
			}
			checkAgainstModel(t, l, m, key, n, s.take, a.name+" step "+itoa(i))
		}
	})
}

// FuzzTokenBucketMatchesXTimeRate compares TokenBucket with
// golang.org/x/time/rate at the same instants, allowing disagreement only
// where the exact token count equals the request to within float rounding.
func FuzzTokenBucketMatchesXTimeRate(f *testing.F) {
	fuzzSeeds(f)
	tg := redistest.Embedded(f)
	clock := tg.Clock(f)
	keys := 0
	f.Fuzz(func(t *testing.T, _, shapeIndex byte, data []byte) {
		shape := fuzzShapes[int(shapeIndex)%len(fuzzShapes)]
		r, burst := shape.rate, shape.capacity
		l := newLimiter(t, tg, throttle.TokenBucket{Rate: r, Burst: burst})
		ref := rate.NewLimiter(rate.Limit(float64(r.N)/r.Per.Seconds()), burst)
		exact := newTokenBucketModel(r.N, r.Per, burst)
		keys++
		key := "fuzz-" + itoa(keys)
		for i, s := range decodeSteps(data, burst, r.Per) {
			clock.Advance(s.advance)
			now := clock.Now()
			tokens := new(big.Rat).Set(exact.refill(now.UnixMicro()))
			got := allowN(t, l, key, s.n)
			want := ref.AllowN(now, s.n)
			exact.decide(now.UnixMicro(), int64(s.n), true)
			if got.Allowed != want {
				gap, _ := new(big.Rat).Sub(tokens, big.NewRat(int64(s.n), 1)).Float64()
				if gap < -1e-9 || gap > 1e-9 {
					t.Fatalf("step %d, n=%d, exact tokens %s: TokenBucket allowed=%v, x/time/rate %v",
						i, s.n, tokens.FloatString(12), got.Allowed, want)
				}
				return // float rounding at an exact boundary: the two diverge from here
			}
		}
	})
}
