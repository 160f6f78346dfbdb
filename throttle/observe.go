package throttle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Op names the kind of call a [Decision] answers.
type Op string

// The calls a limiter reports to its [Observer].
const (
	OpAllow   Op = "allow"   // Allow, AllowN, Wait on the window policies, AllowMany; a worker task's start on a TokenBucket or GCRA
	OpPeek    Op = "peek"    // Peek
	OpReserve Op = "reserve" // Reserve, and Wait on the meters (and the worker's bookings)
	OpAcquire Op = "acquire" // ConcurrencyLimiter.Acquire
	// OpWait is the sleep of Wait, WaitN or Reservation.Wait, reported
	// when it ends and only when the call slept: Latency is the time it
	// slept, Outcome Admitted when the turn came or Errored when the
	// context ended first. It follows the decisions the call made and is
	// not one itself: package metrics leaves it out of its decision series.
	OpWait Op = "wait"
	// OpShare is a renewal of this process's share of a key's rate
	// ([WithLeasedShares]), made in the background: Outcome Admitted when
	// a share was granted, Throttled when none was (the process asks
	// Redis meanwhile), Errored when Redis did not answer (the share runs
	// out at its lease's end). N is 0: it asks for no units. ctx carries no
	// caller's span.
	OpShare Op = "share"
)

// Outcome is how a decision ended.
type Outcome int

const (
	// Admitted: the request was allowed (or, for Peek, would be).
	Admitted Outcome = iota
	// Throttled: the request was rejected by the policy; being throttled
	// is not an error.
	Throttled
	// Errored: the call returned an error: bad input, the caller's context,
	// or Redis unavailable under FailClosed.
	Errored
	// Degraded: Redis could not answer and FailOpen let the request
	// through.
	Degraded
)

// String returns "admitted", "throttled", "error" or "degraded", the
// values metrics label outcomes with.
func (o Outcome) String() string {
	switch o {
	case Admitted:
		return "admitted"
	case Throttled:
		return "throttled"
	case Errored:
		return "error"
	case Degraded:
		return "degraded"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Decision describes one call a limiter answered, for an [Observer].
type Decision struct {
	// Limiter is the limiter's name (see [New]).
	Limiter string
	// Op is the kind of call.
	Op Op
	// Key is the caller key. It is unbounded in number: never use it as a
	// metric label.
	Key string
	// N is the number of units asked for.
	N int
	// Policy is the policy that decided, in the short form ParsePolicy
	// reads ("gcra:10/1s:5"): the one in force for Key, which a plan
	// (WithPlan) or a stored policy (PolicyStore) may have chosen; for a
	// ConcurrencyLimiter, its policy as its keys write it ("conc:3/30s").
	// Empty when no policy decided (bad input).
	Policy string
	// PolicySource says where Policy came from: SourceCode (the policy the
	// limiter was created with), SourcePlan (WithPlan chose it for Key),
	// SourceStored (stored for the limiter with a PolicyStore) or
	// SourceStoredForKey (stored for Key alone). Empty when Policy is.
	PolicySource PolicySource
	// Outcome is how the call ended.
	Outcome Outcome
	// Cached reports a rejection answered from the deny cache, without
	// Redis.
	Cached bool
	// Leased reports a decision made in this process under its leased
	// share of the key's rate (WithLeasedShares), without Redis.
	Leased bool
	// RetryAfter is, for a Throttled decision, how long until the request
	// could be admitted (the Result's RetryAfter); zero otherwise.
	RetryAfter time.Duration
	// Latency is how long the call took, Redis round trip included.
	Latency time.Duration
	// Slot is when the admitted units may start, on the Redis server's
	// clock: the moment Redis decided, for Allow and Acquire; the start of
	// the booked slot, for Reserve. Compare Slots with each other, not with
	// this process's clock. Zero unless Admitted by Redis (a Peek, a
	// Degraded admission and a rejection have none).
	Slot time.Time
	// Err is the error returned (Errored), or the Redis failure behind a
	// Degraded admission.
	Err error
}

// RedisFailed reports whether Redis failed the decision: the error wraps
// [ErrUnavailable] or [ErrRefused], or the decision was Degraded. Bad input
// and a caller's own cancelled context are not Redis failures.
func (d Decision) RedisFailed() bool {
	return d.Outcome == Degraded || errors.Is(d.Err, ErrUnavailable) || errors.Is(d.Err, ErrRefused)
}

// Where the policy in force for a caller key comes from, in
// [Decision.PolicySource]: the order in which a Limiter looks for it is
// stored for the key, stored for the limiter, the plan's, the code's.
const (
	SourceCode         PolicySource = "code"
	SourcePlan         PolicySource = "plan"
	SourceStored       PolicySource = "stored"
	SourceStoredForKey PolicySource = "stored for key"
)

// PolicySource says where the policy in force for a caller key came from:
// one of the Source constants.
type PolicySource string

// Observer receives every decision of the limiters it is given to with
// [WithObserver]: the hook for metrics and traces (see packages metrics
// and throttleotel). ObserveDecision is called synchronously on the
// caller's goroutine after the decision, with the context the call was
// given (a tracer finds the caller's span in it; it may have ended), so it
// must be quick, and safe for concurrent use.
type Observer interface {
	ObserveDecision(context.Context, Decision)
}

// ObserverFunc adapts a function to an [Observer].
type ObserverFunc func(context.Context, Decision)

// ObserveDecision calls f.
func (f ObserverFunc) ObserveDecision(ctx context.Context, d Decision) { f(ctx, d) }

// WithObserver sends every decision of the limiter to o. Given more than
// once, every observer receives every decision, in the order given (a
// metrics.Collector and a dashboard.Publisher, say). Default: none.
func WithObserver(o Observer) Option {
	return optionFunc(func(c *config) error {
		if o == nil {
			return fmt.Errorf("%w: nil observer", ErrInvalidOption)
		}
		if c.observer != nil {
			c.observer = observers{c.observer, o}
		} else {
			c.observer = o
		}
		return nil
	})
}

// observers sends each decision to both, in order.
type observers [2]Observer

func (o observers) ObserveDecision(ctx context.Context, d Decision) {
	o[0].ObserveDecision(ctx, d)
	o[1].ObserveDecision(ctx, d)
}

// WithLivePolicies makes a [Limiter] apply the policies an operator
// stores for its name with a [PolicyStore] (throttlectl set, the
// dashboard) while it runs: they override the policy in code, for every
// caller key or for one, and reach every process within about a second.
// The limiter re-reads its name's stored policies in the background every
// 250 ms while it decides, and before a decision after 750 ms idle: about
// four small reads a second per process while busy. Default: off, the
// policy in code (and WithPlan's) applies.
func WithLivePolicies() Option {
	return optionFunc(func(c *config) error {
		c.live = true
		return nil
	})
}

// WithLogger sets where the limiter logs, with log/slog: Redis failures, at
// Warn (at Error for [ErrRefused]), no more than one record per limiter each outageLogEvery with the
// count of failures in between. Decisions themselves are never logged.
// Default: slog.Default(). nil discards.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) error {
		if l == nil {
			l = slog.New(slog.DiscardHandler)
		}
		c.logger = l
		return nil
	})
}

// outageLogEvery is the least time between two outage records of one
// limiter.
const outageLogEvery = 10 * time.Second

// began returns the time a call starts, read only when an observer will
// be told how long the call took: a decision the deny cache answers takes
// a few hundred nanoseconds, and reading the clock twice would add a third.
func (c *conn) began() time.Time {
	if c.cfg.observer == nil {
		return time.Time{}
	}
	return time.Now()
}

// observe reports a call that started at start (see began) to the
// observer, and logs Redis failures.
func (c *conn) observe(ctx context.Context, op Op, key string, n int, start time.Time, r Result, err error) {
	if c.cfg.observer == nil && err == nil && !r.Degraded {
		return
	}
	d := Decision{Limiter: c.cfg.name, Op: op, Key: key, N: n, Err: err, Cached: r.Cached, Leased: r.Leased}
	switch {
	case r.policy != nil:
		d.Policy, d.PolicySource = r.policy.form, r.policy.source
	case c.fixed != "" && err == nil:
		d.Policy, d.PolicySource = c.fixed, SourceCode
	}
	switch {
	case err != nil:
		d.Outcome = Errored
	case r.Degraded:
		d.Outcome = Degraded
		d.Err = r.cause
	case r.Allowed:
		d.Outcome = Admitted
		if op != OpPeek && r.serverTime > 0 {
			d.Slot = time.UnixMicro(r.serverTime)
		}
	default:
		d.Outcome = Throttled
		d.RetryAfter = r.RetryAfter
	}
	if !start.IsZero() {
		d.Latency = time.Since(start)
	}
	if d.RedisFailed() {
		c.logOutage(ctx, d)
	}
	if c.cfg.observer != nil {
		c.cfg.observer.ObserveDecision(ctx, d)
	}
}

// observeWait reports a sleep of Wait, WaitN or Reservation.Wait that
// began at start and ended with err (nil: the turn came), as an [OpWait].
func (c *conn) observeWait(ctx context.Context, key string, n int, start time.Time, err error) {
	if c.cfg.observer == nil {
		return
	}
	d := Decision{Limiter: c.cfg.name, Op: OpWait, Key: key, N: n, Outcome: Admitted, Latency: time.Since(start)}
	if err != nil {
		d.Outcome, d.Err = Errored, err
	}
	c.cfg.observer.ObserveDecision(ctx, d)
}

// logOutage logs a decision Redis could not make, at most once per
// outageLogEvery.
func (c *conn) logOutage(ctx context.Context, d Decision) {
	ok, suppressed := c.outages.Allow(time.Now(), outageLogEvery)
	if !ok {
		return
	}
	logger := c.cfg.logger
	if logger == nil {
		logger = slog.Default()
	}
	attrs := []slog.Attr{slog.String("limiter", d.Limiter), slog.String("op", string(d.Op)),
		slog.String("outcome", d.Outcome.String())}
	if d.Latency > 0 { // measured when the limiter has an observer
		attrs = append(attrs, slog.Duration("latency", d.Latency))
	}
	attrs = append(attrs, slog.Int("failures_not_logged", suppressed), slog.Any("error", d.Err))
	level := slog.LevelWarn
	if errors.Is(d.Err, ErrRefused) {
		level = slog.LevelError // a configuration error: it will not mend itself
	}
	logger.LogAttrs(ctx, level, "throttle: redis failed a decision", attrs...)
}
