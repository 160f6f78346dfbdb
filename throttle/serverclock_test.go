package throttle_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// TestAgreesWithModelOnServerClock runs random requests against the
// environment's Redis on its own running clock, with short periods, and
// replays each decision in the reference model at the server time the
// script reports. On a real server this checks the Lua as real Redis runs
// it, key expiry included.
func TestAgreesWithModelOnServerClock(t *testing.T) {
	const capacity = 4
	period := 60 * time.Millisecond
	for _, a := range algorithmsWith(capacity, period, throttle.Rate{N: 3, Per: period}) {
		t.Run(a.name, func(t *testing.T) {
			tg := redistest.New(t)
			l := newLimiter(t, tg, a.policy)
			m := a.model()
			rng := rand.New(rand.NewPCG(11, uint64(len(a.name))))
			var allowed, rejected int
			for i := range 150 {
				if rng.IntN(3) == 0 {
					time.Sleep(time.Duration(rng.Int64N(int64(period / 2))))
				}
				n, take := 1+rng.IntN(capacity), rng.IntN(8) != 0
				if !take {
					n = 1
				}
				r := checkAgainstModel(t, l, m, "k", n, take, "step "+itoa(i))
				if r.Allowed {
					allowed++
				} else {
					rejected++
				}
			}
			if allowed < 10 || rejected < 10 {
				t.Fatalf("%d allowed, %d rejected: the walk did not exercise both outcomes", allowed, rejected)
			}
			checkTTLs(t, tg)
		})
	}
}
