package throttle

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keyspace"
)

// Option configures a [Limiter]; pass options to [New].
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

// DefaultPrefix starts every Redis key a Limiter writes, unless changed with
// [WithPrefix].
const DefaultPrefix = "throttle:"

// config holds the options; its zero value is not the default, see
// defaultConfig.
type config struct {
	prefix    string
	timeout   time.Duration
	failure   FailurePolicy
	denyCache int
	coalesce  int
	observer  Observer
	name      string // the limiter's name
	live      bool   // WithLivePolicies
	// inspecting: a tool's view of the limiter's keys, which records
	// nothing in the registry (keyspace.Inspecting)
	inspecting bool
	plan       func(ctx context.Context, key string) Policy
	logger     *slog.Logger // nil: slog.Default() when logging
	hashOver   int          // -1: caller keys are never hashed
	// acks and acksTimeout: WithReplicaAcks (0: off)
	acks        int
	acksTimeout time.Duration
	// lease: WithLeasedShares (0: off)
	lease time.Duration
}

// defaultCoalescing is how many concurrent decisions may share a round
// trip unless changed with [WithCoalescing].
const defaultCoalescing = 64

func defaultConfig() config {
	return config{prefix: DefaultPrefix, failure: FailClosed, coalesce: defaultCoalescing, hashOver: -1}
}

// WithPrefix sets the string every Redis key of the Limiter starts with.
// Default: [DefaultPrefix], "throttle:". The prefix may be empty. It holds
// no '{' or '}', or exactly one hash tag, such as "throttle:{jobs}:": then
// every key under it is in the one Redis Cluster slot of that name, so a
// task's rules are asked in one round trip whatever they key by, and that
// one node does all of their work (see "Keys and Redis Cluster" in
// docs/limiters.md).
func WithPrefix(prefix string) Option {
	return optionFunc(func(c *config) error {
		if err := keyspace.CheckPrefix(prefix); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidOption, err)
		}
		c.prefix = prefix
		return nil
	})
}

// WithTimeout bounds each decision: a call that has no answer from Redis
// after d fails with [ErrUnavailable] (or is allowed and Degraded under
// [FailOpen]). Default: 0, no bound beyond the caller's context and the
// client's own timeouts. go-redis applies a context deadline to socket reads
// only when the client is built with ContextTimeoutEnabled; otherwise its
// ReadTimeout applies once a command has been sent.
func WithTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d < 0 {
			return fmt.Errorf("%w: timeout must not be negative, got %s", ErrInvalidOption, d)
		}
		c.timeout = d
		return nil
	})
}

// FailurePolicy says what a decision returns when Redis cannot answer.
type FailurePolicy int

const (
	// FailClosed rejects: the call returns an error wrapping
	// [ErrUnavailable]. The default: nothing passes unmetered.
	FailClosed FailurePolicy = iota
	// FailOpen admits: the call returns a Result with Allowed and Degraded
	// set, and a nil error, so work goes on while Redis is down.
	FailOpen
)

// String returns "fail-closed" or "fail-open".
func (p FailurePolicy) String() string {
	switch p {
	case FailClosed:
		return "fail-closed"
	case FailOpen:
		return "fail-open"
	}
	return fmt.Sprintf("FailurePolicy(%d)", int(p))
}

// WithFailurePolicy chooses between [FailClosed] (the default) and
// [FailOpen] for decisions Redis cannot make. A caller's own cancelled or
// expired context is always returned as an error, under either policy.
func WithFailurePolicy(p FailurePolicy) Option {
	return optionFunc(func(c *config) error {
		if p != FailClosed && p != FailOpen {
			return fmt.Errorf("%w: unknown failure policy %d", ErrInvalidOption, int(p))
		}
		c.failure = p
		return nil
	})
}

// WithDenyCache keeps, in this process, the rejections Redis has given for
// up to size keys, and answers further requests for a rejected key locally
// (Result.Cached) until the rejection's RetryAfter has passed, without
// asking Redis. It can only deny what Redis already denied, so it never
// over-admits: under a flood of requests on an over-limit key, only the
// first in each wait goes to Redis. A rejection is forgotten as soon as
// another policy is in force for its key (a stored policy or a plan
// changed), so a raise applies to refused keys as quickly as to others. The
// price is that capacity freed early for that key (a Reset or Cancel in
// another process) is seen only when the wait ends. Default: 0, off.
func WithDenyCache(size int) Option {
	return optionFunc(func(c *config) error {
		if size < 0 {
			return fmt.Errorf("%w: deny cache size must not be negative, got %d", ErrInvalidOption, size)
		}
		c.denyCache = size
		return nil
	})
}

// WithCoalescing sets how many decisions asked of the Limiter at the same
// moment may share one round trip. While four round trips of the Limiter
// are in flight, further Allow, AllowN and Peek calls queue up, and the
// next round trip carries up to limit of them in one pipeline. Nothing waits
// on a timer (callers send at once while fewer are in flight), so it costs
// nothing at low concurrency, and under many concurrent callers it saves
// the client and the server a system call and a network exchange per
// decision (GCRA made 1.5 times the decisions per second of one round
// trip each at 64 goroutines, in docs/benchmarks.md). Each decision is still its own atomic script with its
// own Result; callers queued together are decided in the order they
// queued. A queued caller's cancellation, and WithTimeout, count from its
// call: one that gives up before its round trip is sent is never decided.
// Default: 64. 0 or 1 turns it off (each decision its own round trip); limit
// must not be negative.
func WithCoalescing(limit int) Option {
	return optionFunc(func(c *config) error {
		if limit < 0 {
			return fmt.Errorf("%w: coalescing limit must not be negative, got %d", ErrInvalidOption, limit)
		}
		c.coalesce = limit
		return nil
	})
}

// WithKeyHashing stores caller keys longer than over bytes in Redis by
// their SHA-256 instead (66 bytes: "%#" and 64 hex digits), so
// that Redis memory per key stays bounded however long the caller keys are
// (a GCRA key's state is under 100 bytes; a caller key of 1 MB makes a
// Redis key of 1 MB). Distinct caller keys keep distinct state: a hashed
// form never equals a key stored as is. The price is that operators see
// the hash, not the key, in Redis and in throttlectl; Limiter.Key still
// maps a caller key to its Redis key. over 0 hashes every key, which also
// keeps personal data (an e-mail address as a key) out of Redis. Default:
// off, keys are stored as they are, with '%', '{' and '}' escaped.
func WithKeyHashing(over int) Option {
	return optionFunc(func(c *config) error {
		if over < 0 {
			return fmt.Errorf("%w: key hashing bound must not be negative, got %d", ErrInvalidOption, over)
		}
		c.hashOver = over
		return nil
	})
}

// log returns the logger to use.
func (c *config) log() *slog.Logger {
	if c.logger == nil {
		return slog.Default()
	}
	return c.logger
}

// WithPlan chooses the policy of each caller key: plan returns the policy
// for key (a tenant's plan, free or pro), or nil for the Limiter's own. Its
// policies must be of the Limiter's algorithm (decisions for a key whose
// plan is not fail with [ErrInvalidPolicy]); a policy stored with
// [PolicyStore] takes precedence. plan is called on every decision, from
// many goroutines at once: keep it fast, and return a few distinct
// policies (each is prepared once and kept). Default: none.
func WithPlan(plan func(ctx context.Context, key string) Policy) Option {
	return optionFunc(func(c *config) error {
		if plan == nil {
			return fmt.Errorf("%w: nil plan", ErrInvalidOption)
		}
		c.plan = plan
		return nil
	})
}
