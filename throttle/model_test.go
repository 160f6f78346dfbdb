package throttle_test

import (
	"math/big"
	"sort"
	"time"
)

// decision is what a reference model says one request gets. Times are in
// microseconds, as the scripts compute them.
type decision struct {
	Allowed    bool
	Remaining  int64
	RetryAfter int64
	ResetAfter int64
}

// model is a pure-Go reference for one algorithm on one key. It is written
// from the algorithm's textbook definition with exact rationals, not from
// the Lua's integer scaling, so agreement between the two means something.
// now never decreases between calls.
type model interface {
	decide(now, n int64, take bool) decision
}

// --- fixed window ---

type fixedWindowModel struct {
	limit, window int64
	counts        map[int64]int64 // units admitted per window index
}

func newFixedWindowModel(limit int, window time.Duration) model {
	return &fixedWindowModel{limit: int64(limit), window: window.Microseconds(), counts: map[int64]int64{}}
}

func (m *fixedWindowModel) decide(now, n int64, take bool) decision {
	index := now / m.window
	end := (index+1)*m.window - now
	count := m.counts[index]
	if count+n > m.limit {
		return decision{false, m.limit - count, end, end}
	}
	if take {
		count += n
		m.counts[index] = count
	}
	reset := int64(0)
	if count > 0 {
		reset = end
	}
	return decision{true, m.limit - count, 0, reset}
}

// --- sliding log ---

type slidingLogModel struct {
	limit, window int64
	admitted      []int64 // one admission time per unit, ascending
}

func newSlidingLogModel(limit int, window time.Duration) model {
	return &slidingLogModel{limit: int64(limit), window: window.Microseconds()}
}

func (m *slidingLogModel) decide(now, n int64, take bool) decision {
	// Units admitted at t count while now < t + window.
	first := sort.Search(len(m.admitted), func(i int) bool { return m.admitted[i]+m.window > now })
	inWindow := m.admitted[first:]
	count := int64(len(inWindow))
	reset := func() int64 {
		if len(m.admitted) == 0 {
			return 0
		}
		return max(0, m.admitted[len(m.admitted)-1]+m.window-now)
	}
	if count+n > m.limit {
		oldestToLeave := inWindow[count+n-m.limit-1]
		return decision{false, m.limit - count, oldestToLeave + m.window - now, reset()}
	}
	if take {
		for range n {
			m.admitted = append(m.admitted, now)
		}
		count += n
	}
	return decision{true, m.limit - count, 0, reset()}
}

// --- sliding window counter ---

type slidingWindowModel struct {
	limit, window, unit int64
	counts              map[int64]int64
}

func newSlidingWindowModel(limit int, window time.Duration) model {
	unit := int64(1)
	if window%time.Millisecond == 0 {
		unit = 1000
	}
	return &slidingWindowModel{limit: int64(limit), window: window.Microseconds(), unit: unit, counts: map[int64]int64{}}
}

// estimate is the weighted count at t: the previous window's count times the
// share of it the sliding window still covers (elapsed time measured in
// whole units), plus the current window's count.
func (m *slidingWindowModel) estimate(t int64) *big.Rat {
	index := t / m.window
	elapsed := (t - index*m.window) / m.unit * m.unit
	weight := big.NewRat(m.window-elapsed, m.window)
	est := new(big.Rat).Mul(weight, big.NewRat(m.counts[index-1], 1))
	return est.Add(est, big.NewRat(m.counts[index], 1))
}

func (m *slidingWindowModel) admits(t, n int64) bool {
	room := new(big.Rat).Sub(big.NewRat(m.limit, 1), big.NewRat(n, 1))
	return m.estimate(t).Cmp(room) <= 0
}

func (m *slidingWindowModel) decide(now, n int64, take bool) decision {
	index := now / m.window
	remaining := func() int64 {
		left := new(big.Rat).Sub(big.NewRat(m.limit, 1), m.estimate(now))
		return max(0, ratFloor(left))
	}
	reset := func() int64 {
		switch {
		case m.counts[index] > 0:
			return (index+2)*m.window - now
		case m.counts[index-1] > 0:
			return (index+1)*m.window - now
		}
		return 0
	}
	if !m.admits(now, n) {
		// The estimate never rises while nothing is admitted, so the first
		// instant that admits can be found by bisection.
		lo, hi := now, now+2*m.window
		for lo+1 < hi {
			mid := (lo + hi) / 2
			if m.admits(mid, n) {
				hi = mid
			} else {
				lo = mid
			}
		}
		return decision{false, remaining(), hi - now, reset()}
	}
	if take {
		m.counts[index] += n
	}
	return decision{true, remaining(), 0, reset()}
}

// --- token bucket: tokens and the time of the last refill ---

type tokenBucketModel struct {
	burst  *big.Rat
	rate   *big.Rat // tokens per microsecond
	tokens *big.Rat
	last   int64
	seen   bool
}

func newTokenBucketModel(n int, per time.Duration, burst int) *tokenBucketModel {
	return &tokenBucketModel{burst: big.NewRat(int64(burst), 1), rate: big.NewRat(int64(n), per.Microseconds())}
}

// refill brings the bucket to now and returns the tokens in it.
func (m *tokenBucketModel) refill(now int64) *big.Rat {
	if !m.seen {
		m.tokens, m.last, m.seen = new(big.Rat).Set(m.burst), now, true
	}
	grown := new(big.Rat).Mul(m.rate, big.NewRat(now-m.last, 1))
	m.tokens.Add(m.tokens, grown)
	if m.tokens.Cmp(m.burst) > 0 {
		m.tokens.Set(m.burst)
	}
	m.last = now
	return m.tokens
}

func (m *tokenBucketModel) decide(now, n int64, take bool) decision {
	tokens := m.refill(now)
	want := big.NewRat(n, 1)
	resetAfter := func() int64 { return timeFor(new(big.Rat).Sub(m.burst, tokens), m.rate) }
	if tokens.Cmp(want) < 0 {
		return decision{false, ratFloor(tokens), timeFor(new(big.Rat).Sub(want, tokens), m.rate), resetAfter()}
	}
	if take {
		tokens.Sub(tokens, want)
	}
	return decision{true, ratFloor(tokens), 0, resetAfter()}
}

// --- leaky bucket: the water level and when it was measured ---

type leakyBucketModel struct {
	capacity *big.Rat
	rate     *big.Rat // drops leaked per microsecond
	level    *big.Rat
	last     int64
}

func newLeakyBucketModel(n int, per time.Duration, capacity int) model {
	return &leakyBucketModel{capacity: big.NewRat(int64(capacity), 1), rate: big.NewRat(int64(n), per.Microseconds()), level: new(big.Rat)}
}

func (m *leakyBucketModel) decide(now, n int64, take bool) decision {
	leaked := new(big.Rat).Mul(m.rate, big.NewRat(now-m.last, 1))
	m.level.Sub(m.level, leaked)
	if m.level.Sign() < 0 {
		m.level.SetInt64(0)
	}
	m.last = now
	pour := big.NewRat(n, 1)
	after := new(big.Rat).Add(m.level, pour)
	if after.Cmp(m.capacity) > 0 {
		over := new(big.Rat).Sub(after, m.capacity)
		return decision{false, ratFloor(new(big.Rat).Sub(m.capacity, m.level)), timeFor(over, m.rate), timeFor(m.level, m.rate)}
	}
	if take {
		m.level = after
	}
	return decision{true, ratFloor(new(big.Rat).Sub(m.capacity, m.level)), 0, timeFor(m.level, m.rate)}
}

// --- GCRA: the theoretical arrival time ---

type gcraModel struct {
	interval  *big.Rat // T, microseconds per unit
	tolerance *big.Rat // burst × T
	tat       *big.Rat
}

func newGCRAModel(n int, per time.Duration, burst int) model {
	interval := big.NewRat(per.Microseconds(), int64(n))
	return &gcraModel{interval: interval, tolerance: new(big.Rat).Mul(interval, big.NewRat(int64(burst), 1)), tat: new(big.Rat)}
}

func (m *gcraModel) decide(now, n int64, take bool) decision {
	return m.decideAt(big.NewRat(now, 1), n, take)
}

// decideAt is decide at an instant that may fall between microseconds.
func (m *gcraModel) decideAt(t *big.Rat, n int64, take bool) decision {
	tat := new(big.Rat).Set(m.tat)
	if tat.Cmp(t) < 0 {
		tat.Set(t)
	}
	newTat := new(big.Rat).Add(tat, new(big.Rat).Mul(m.interval, big.NewRat(n, 1)))
	allowAt := new(big.Rat).Sub(newTat, m.tolerance)
	// remaining: how many intervals fit between now and tat - tolerance
	// (none while reservations have run the meter into debt)
	remaining := func(tat *big.Rat) int64 {
		free := new(big.Rat).Sub(t, new(big.Rat).Sub(tat, m.tolerance))
		return max(0, ratFloor(free.Quo(free, m.interval)))
	}
	if allowAt.Cmp(t) > 0 {
		return decision{false, remaining(tat), ratCeil(new(big.Rat).Sub(allowAt, t)), ratCeil(new(big.Rat).Sub(tat, t))}
	}
	if take {
		m.tat, tat = newTat, newTat
	}
	return decision{true, remaining(tat), 0, ratCeil(new(big.Rat).Sub(tat, t))}
}

// --- exact rational helpers ---

func ratFloor(r *big.Rat) int64 {
	q := new(big.Int).Div(r.Num(), r.Denom()) // Euclidean: floor for a positive denominator
	return q.Int64()
}

func ratCeil(r *big.Rat) int64 {
	return -ratFloor(new(big.Rat).Neg(r))
}

// timeFor is how many whole microseconds, rounded up, it takes for amount to
// accrue at rate per microsecond.
func timeFor(amount, rate *big.Rat) int64 {
	return ratCeil(new(big.Rat).Quo(amount, rate))
}

// --- reservations on the GCRA model (TokenBucket makes the same decisions) ---

// reserve books n units when their wait is at most maxWait microseconds. It
// returns the decision (RetryAfter holding the start delay when booked) and
// the booking's end instant.
func (m *gcraModel) reserve(now, n, maxWait int64) (decision, *big.Rat) {
	t := big.NewRat(now, 1)
	tat := new(big.Rat).Set(m.tat)
	if tat.Cmp(t) < 0 {
		tat.Set(t)
	}
	newTat := new(big.Rat).Add(tat, new(big.Rat).Mul(m.interval, big.NewRat(n, 1)))
	wait := new(big.Rat).Sub(new(big.Rat).Sub(newTat, m.tolerance), t)
	remaining := func(tat *big.Rat) int64 {
		free := new(big.Rat).Sub(t, new(big.Rat).Sub(tat, m.tolerance))
		return max(0, ratFloor(free.Quo(free, m.interval)))
	}
	if wait.Cmp(big.NewRat(maxWait, 1)) > 0 {
		over := new(big.Rat).Sub(wait, big.NewRat(maxWait, 1))
		return decision{false, remaining(tat), ratCeil(over), ratCeil(new(big.Rat).Sub(tat, t))}, nil
	}
	m.tat = newTat
	return decision{true, remaining(newTat), max(0, ratCeil(wait)), ratCeil(new(big.Rat).Sub(newTat, t))}, newTat
}

// cancel gives back what it can of an unused booking of n units that ended
// at end: its part still ahead of now, less what later bookings that start
// in the future stand on.
func (m *gcraModel) cancel(now, n int64, end *big.Rat) {
	t := big.NewRat(now, 1)
	tat := new(big.Rat).Set(m.tat)
	if tat.Cmp(t) < 0 {
		tat.Set(t)
	}
	debt := new(big.Rat).Sub(tat, t)
	toEnd := new(big.Rat).Sub(end, t)
	standOn := new(big.Rat).Set(toEnd)
	if standOn.Cmp(m.tolerance) < 0 {
		standOn.Set(m.tolerance)
	}
	later := new(big.Rat).Sub(debt, standOn)
	back := new(big.Rat).Mul(m.interval, big.NewRat(n, 1))
	for _, bound := range []*big.Rat{toEnd, debt} {
		if back.Cmp(bound) > 0 {
			back.Set(bound)
		}
	}
	if later.Sign() > 0 {
		back.Sub(back, later)
	}
	if back.Sign() > 0 {
		m.tat = tat.Sub(tat, back)
	}
}
