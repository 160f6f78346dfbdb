package throttle

import (
	"fmt"
	"time"
)

// Rate is N events per Per: PerSecond(10) is ten events each second, spread
// evenly at one every 100 ms by the rate-based policies. Per must be a whole
// number of microseconds (the resolution of Redis's clock). The zero Rate is
// invalid.
type Rate struct {
	N   int
	Per time.Duration
}

// PerSecond returns a rate of n events per second.
func PerSecond(n int) Rate { return Rate{N: n, Per: time.Second} }

// PerMinute returns a rate of n events per minute.
func PerMinute(n int) Rate { return Rate{N: n, Per: time.Minute} }

// PerHour returns a rate of n events per hour.
func PerHour(n int) Rate { return Rate{N: n, Per: time.Hour} }

// PerDay returns a rate of n events per 24 hours. For a quota that resets
// at midnight in a time zone, use [Quota].
func PerDay(n int) Rate { return Rate{N: n, Per: 24 * time.Hour} }

// String formats the rate as "N/Per", for example "10/1s".
func (r Rate) String() string { return fmt.Sprintf("%d/%s", r.N, r.Per) }

// Validate reports whether the rate is usable: N at least 1, and Per a
// whole number of microseconds between 1 µs and ten years.
func (r Rate) Validate() error { return r.validate("Rate") }

// validate is Validate with the rate's field name for the message.
func (r Rate) validate(field string) error {
	if r.N < 1 {
		return invalidPolicy("%s.N must be at least 1, got %d", field, r.N)
	}
	return checkSpan(field+".Per", r.Per, time.Microsecond)
}

// interval returns the time between two events as the fraction num/den of a
// microsecond, in lowest terms. Call it on a validated rate.
func (r Rate) interval() (num, den int64) {
	num, den = r.Per.Microseconds(), int64(r.N)
	g := gcd(num, den)
	return num / g, den / g
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// maxSpan is the longest window or period a policy may have. Together with
// maxExact it keeps every number the scripts compute below 2^53, where Lua's
// doubles stop being exact, until the year 2200.
const maxSpan = 10 * 365 * 24 * time.Hour

// maxExact bounds the products the scripts form (burst × interval, limit ×
// window), leaving headroom below 2^53 for the sums made with them.
const maxExact = 1 << 50

// checkSpan validates a window or period: at least least, at most maxSpan,
// and a whole number of microseconds.
func checkSpan(field string, d, least time.Duration) error {
	switch {
	case d < least:
		return invalidPolicy("%s must be at least %s, got %s", field, least, d)
	case d > maxSpan:
		return invalidPolicy("%s must be at most %s, got %s", field, maxSpan, d)
	case d%time.Microsecond != 0:
		return invalidPolicy("%s must be a whole number of microseconds, got %s", field, d)
	}
	return nil
}
