package throttle

import "time"

// Result is the outcome of one decision. Being throttled is a Result with
// Allowed false, not an error.
type Result struct {
	// Allowed reports whether the request was admitted (and, for Allow,
	// consumed capacity).
	Allowed bool

	// Limit is the policy's capacity: Limit of the window policies, Burst of
	// TokenBucket and GCRA, Capacity of LeakyBucket.
	Limit int

	// Remaining is how many more units would be admitted right now, after
	// this decision.
	Remaining int

	// RetryAfter is 0 when Allowed. When rejected, it is the exact wait
	// after which the same request is admitted if nothing else consumes
	// capacity meanwhile: rounded up to the microsecond, never early. (For
	// SlidingWindow, exact with respect to its own estimate.)
	RetryAfter time.Duration

	// ResetAfter is how long until the key is back to full capacity if
	// nothing more is admitted; 0 when it is full now.
	ResetAfter time.Duration

	// Degraded reports a decision made without Redis under [FailOpen]: the
	// request is allowed, and only Allowed and Limit are meaningful.
	Degraded bool

	// Cached reports a rejection answered in this process from one Redis
	// gave earlier (see [WithDenyCache]): RetryAfter is the time left of
	// that rejection and Remaining is 0.
	Cached bool

	// Leased reports a decision made in this process under its share of
	// the key's rate ([WithLeasedShares]), without Redis. Remaining,
	// RetryAfter and ResetAfter are those of the share.
	Leased bool

	// serverTime is the Redis clock, in Unix microseconds, at which the
	// script decided; 0 when Degraded.
	serverTime int64

	// cause is the Redis failure behind a Degraded result, for observers.
	cause error
	// policy is the policy that decided, for observers.
	policy *spec
}

// Policy returns the policy that decided: the limiter's own, or the one
// stored for its name or for the key (WithLivePolicies, plans) when that
// one was in force. Nil for a Result not made by a limiter.
func (r Result) Policy() Policy {
	if r.policy == nil {
		return nil
	}
	return r.policy.policy
}
