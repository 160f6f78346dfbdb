package throttle

import (
	"fmt"

	"github.com/redis/go-redis/v9"
)

var (
	meterScript        = limiterScript("meter")
	leakyBucketScript  = limiterScript("leaky_bucket")
	meterBookingScript = limiterScript("meter_booking")
)

// TokenBucket holds up to Burst tokens and refills them continuously at
// Rate; each unit takes one token. A full bucket lets Burst units through at
// once, then the rate applies. It makes the same decisions as
// golang.org/x/time/rate's Limiter with the same rate and burst, shared by
// every process on the Redis. State is one integer per caller key.
type TokenBucket struct {
	Rate  Rate // refill rate
	Burst int  // capacity in tokens, at least 1
}

// Validate implements [Policy].
func (p TokenBucket) Validate() error { return validateMeter("TokenBucket", "Burst", p.Rate, p.Burst) }

func (p TokenBucket) spec() spec {
	s := meterSpec("tb", meterScript, p.Rate, p.Burst)
	s.reservable = true
	return s
}

// LeakyBucket is the leaky bucket as a meter, used for policing: every
// admitted unit adds a drop to a bucket of Capacity drops that leaks at
// Rate, and a request that would overflow it is rejected, not queued. Its
// decisions equal a [TokenBucket]'s with Burst = Capacity; its state is the
// water level and the time it was measured.
type LeakyBucket struct {
	Rate     Rate // leak rate
	Capacity int  // bucket size in units, at least 1
}

// Validate implements [Policy].
func (p LeakyBucket) Validate() error {
	return validateMeter("LeakyBucket", "Capacity", p.Rate, p.Capacity)
}

func (p LeakyBucket) spec() spec { return meterSpec("lb", leakyBucketScript, p.Rate, p.Capacity) }

// GCRA is the generic cell rate algorithm: units are spaced one emission
// interval (Rate.Per / Rate.N) apart, and up to Burst may arrive back to
// back. One integer per caller key, exact; equivalent in its decisions to a
// [TokenBucket] of the same rate and burst, and the policy to reach for by
// default.
type GCRA struct {
	Rate  Rate // sustained rate
	Burst int  // units allowed back to back, at least 1
}

// Validate implements [Policy].
func (p GCRA) Validate() error { return validateMeter("GCRA", "Burst", p.Rate, p.Burst) }

func (p GCRA) spec() spec {
	s := meterSpec("gcra", meterScript, p.Rate, p.Burst)
	s.reservable = true
	return s
}

func validateMeter(name, field string, rate Rate, capacity int) error {
	if err := rate.validate(name + ".Rate"); err != nil {
		return err
	}
	if capacity < 1 {
		return invalidPolicy("%s.%s must be at least 1, got %d", name, field, capacity)
	}
	if num, _ := rate.interval(); int64(capacity) > maxExact/num {
		return invalidPolicy("%s.%s × interval is too large to compute exactly (%d at %s)", name, field, capacity, rate)
	}
	return nil
}

func meterSpec(kind string, script *redis.Script, rate Rate, capacity int) spec {
	num, den := rate.interval()
	return spec{
		kind:     kind,
		id:       fmt.Sprintf("%s:%s:%d", kind, rate, capacity),
		script:   script,
		capacity: capacity,
		args:     boxArgs(itoa(int64(capacity)), itoa(num), itoa(den)),
		den:      den,
		num:      num,
	}
}
