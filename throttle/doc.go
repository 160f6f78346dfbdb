// Package throttle limits the rate of work across a fleet of processes
// through one shared Redis.
//
// A [Limiter] applies one [Policy] to any number of caller keys (a tenant, a
// task type, a partner account). Before each unit of work, ask it:
//
//	limiter, err := throttle.New(client, "partner-api", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 5})
//	...
//	r, err := limiter.Allow(ctx, "tenant-42")
//	if err != nil { ... }          // Redis could not decide (see failure policy)
//	if !r.Allowed { retry after r.RetryAfter }
//
// Every decision is one Lua script, run atomically by Redis in one round
// trip, reading the clock with redis.call('TIME') on the server: no process's
// clock matters, and concurrent callers anywhere never over-admit. A
// rejected request consumes nothing, so a flood of rejections never extends
// anyone's wait.
//
// # Choosing an algorithm
//
// Memory is MEMORY USAGE on Redis 7.0 for a key with a 9-byte prefix and a
// 13-byte caller key, from one admission to a full key (see
// TestMemoryPerKey). A key's size depends on what it holds: a value one
// digit longer can cross one of the allocator's 16-byte size classes.
//
//	Policy         State per key             Accuracy                       Bursts
//	FixedWindow    1 string, 104 B           exact count per aligned window up to 2×Limit across a boundary
//	SlidingLog     sorted set, ~40 B/unit    exact in every window          never more than Limit in any window
//	SlidingWindow  1 string, 104–120 B       weighted estimate              smoothed; may be off by a few units
//	TokenBucket    integer+interval, 104 B   exact                          Burst at once, then Rate
//	LeakyBucket    2 integers, 120 B         exact                          Capacity at once, then Rate
//	GCRA           integer+interval, 120 B   exact                          Burst at once, then Rate
//	Quota          1 string                  exact count per calendar day   up to 2×Limit across midnight
//	                                         or month in a time zone
//
// TokenBucket, LeakyBucket (as a meter) and GCRA with the same rate and
// capacity make identical decisions; they differ in how the state is kept.
// GCRA is the default choice: small, exact, smooth. Pick SlidingLog for
// small limits that must hold in every interval ("at most 5 logins in any 15
// minutes"), FixedWindow for quotas tied to the calendar-like windows
// ("1,000 per minute, counted per minute"). A meter whose interval (Per/N) is
// not a whole number of microseconds keeps a remainder beside its integer
// (about 120 B).
//
// # Names, plans and policies that change
//
// Every limiter has a name ([New]): its state is kept under its name and
// algorithm, so limiters of one name share it and limiters of different
// names never do, and its policy can change and keep what was consumed:
// the meters carry the units spoken for over into the new policy, the
// windows their count while its window lasts; two processes on two
// policies of one name never admit more than the larger allows. Its policy
// can differ per caller key ([WithPlan]: a tenant's plan), and be stored in
// Redis by an operator ([PolicyStore], throttlectl set), for the limiter or
// one key; every process whose limiter has [WithLivePolicies] applies a
// stored policy within a second, without
// a round trip per decision. [Limiter.PolicyFor] says which policy applies
// to a key, and every [Decision] carries it.
//
// # Pacing: Wait, Reserve and concurrency
//
// [Limiter.Wait] blocks until a request is admitted, like
// golang.org/x/time/rate's Wait but fleet-wide, and refuses at once when the
// wait would pass the context's deadline. [Limiter.Reserve] books a future
// slot on a TokenBucket or GCRA: callers reserving one after another get
// start times spaced by the rate, so a backlog flows out at the rate instead
// of returning all at once to be rejected again. Wait uses it on those
// policies: one call to Redis per waiter.
//
// A [ConcurrencyLimiter] caps how many holders a key has at once (work in
// flight rather than a rate). Each [Lease] is renewed in the background
// while its holder lives; a crashed holder's slot frees within one lease.
//
// # Keys
//
// A caller key's state lives at prefix + name + "@" + algorithm + ":{" +
// caller key + "}" ("throttle:partner-api@gcra:{tenant-42}"; see
// [Limiter.Key]). The braces form a Redis Cluster hash tag: a caller key's
// state lives in one slot, and '{', '}' and '%' inside caller keys are
// escaped, so no caller key can move its slot or reach another's state. A
// prefix may hold a hash tag of its own ("throttle:{jobs}:"), which keeps
// every key under it in one slot (see [WithPrefix]). Every key is written with an
// expiry that ends when its state stops mattering: idle keys disappear.
// [WithKeyHashing] stores long caller keys by their SHA-256 instead, so
// that memory per key stays bounded. [ParsePolicy] reads a policy
// back from its short form (throttlectl reads whole keys).
//
// # Failure policy and timeouts
//
// When Redis cannot answer in time, a Limiter fails closed by default: Allow
// returns an error wrapping [ErrUnavailable]. With WithFailurePolicy(FailOpen)
// it returns an allowed Result marked Degraded instead. An answer of Redis
// that will not change by itself (a ClusterClient on a server without
// cluster support, a missing AUTH or ACL permission, a key of another type)
// is an error wrapping [ErrRefused] under either policy: fail-open covers
// outages, never configuration errors. [WithTimeout] bounds how long one
// decision may take.
//
// Every call returns as soon as its context ends, whatever the client's
// options (go-redis applies a context to its reads only with
// ContextTimeoutEnabled, and never its cancellation): a caller's own
// cancelled context always comes back as its context error. What a call
// gives back on its way out (a cancelled Wait's booking, a lease's slot) is
// given back in the background, for up to the limiter's timeout, or 5 s.
//
// # Observing
//
// [WithObserver] hands every decision to an [Observer], with the caller's
// context (package metrics has a Prometheus one; module throttleotel an
// OpenTelemetry one that adds it to the caller's span): the limiter's
// name, the call, its outcome, its latency and any Redis failure, and
// the sleep of a Wait ([OpWait]). Redis failures are also
// logged with log/slog ([WithLogger], slog.Default() unless set), at most
// once per limiter every ten seconds.
//
// # Round trips
//
// Decisions asked of one Limiter at the same moment share round trips:
// while four are in flight, further callers queue and go together in one
// pipeline ([WithCoalescing], up to 64 by default), each still its own
// script with its own Result. [WithDenyCache] answers repeated requests for
// a key Redis has just rejected without asking again, and
// [Limiter.AllowMany] decides many keys in one pipelined round trip.
//
// # Numbers
//
// Scripts count time in integer microseconds (fractions of a microsecond as
// exact integer ticks), never in floats that drift. Policies are validated
// so that every intermediate value stays exact until the year 2200; numbers
// too large for that are rejected by [New] with [ErrInvalidPolicy].
package throttle
