package throttle

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Limiter applies one [Policy] to any number of caller keys, keeping their
// state in Redis so that every process sharing the Redis shares the limit.
// Each decision is one Lua script, run atomically on the Redis server with
// the server's clock. A Limiter is safe for concurrent use; create one per
// policy and reuse it. The zero Limiter is not usable: call [New].
type Limiter struct {
	client redis.UniversalClient
	policy Policy
	spec   spec
	cfg    config
	// deadlines reports whether client applies context deadlines to socket
	// reads; when it does not, timed calls run detached (see call).
	deadlines bool
}

// New returns a Limiter that applies p through client, which may be a
// *redis.Client, *redis.ClusterClient or *redis.Ring. It validates the
// policy and options and talks to no server.
//
// Options and their defaults:
//
//	WithPrefix(s)          "throttle:"   start of every Redis key
//	WithTimeout(d)         0 (none)      bound on each decision
//	WithFailurePolicy(p)   FailClosed    what to do when Redis cannot answer
//
// Errors wrap [ErrInvalidPolicy] or [ErrInvalidOption].
func New(client redis.UniversalClient, p Policy, opts ...Option) (*Limiter, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil redis client", ErrInvalidOption)
	}
	if p == nil {
		return nil, fmt.Errorf("%w: nil policy", ErrInvalidPolicy)
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	cfg := defaultConfig()
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("%w: nil option", ErrInvalidOption)
		}
		if err := opt.apply(&cfg); err != nil {
			return nil, err
		}
	}
	return &Limiter{client: client, policy: p, spec: p.spec(), cfg: cfg, deadlines: honoursDeadlines(client)}, nil
}

// Policy returns the policy the Limiter applies.
func (l *Limiter) Policy() Policy { return l.policy }

// Key returns the Redis key holding the state of callerKey, for inspection
// and operations tools.
func (l *Limiter) Key(callerKey string) string {
	return redisKey(l.cfg.prefix, l.spec.id, callerKey)
}

// Allow is AllowN(ctx, key, 1).
func (l *Limiter) Allow(ctx context.Context, key string) (Result, error) {
	return l.AllowN(ctx, key, 1)
}

// AllowN admits n units for key now, or rejects the request whole and
// reports in RetryAfter when it would be admitted. A rejected request
// consumes nothing. n above the policy's capacity fails with
// [ErrExceedsLimit]; when Redis cannot answer, the failure policy decides.
func (l *Limiter) AllowN(ctx context.Context, key string, n int) (Result, error) {
	return l.decide(ctx, modeTake, key, n)
}

// Peek reports what Allow would decide for key now, without consuming
// anything: Allowed, Remaining, RetryAfter for one unit and ResetAfter.
// Peek ignores the failure policy: when Redis cannot answer it returns an
// error wrapping [ErrUnavailable].
func (l *Limiter) Peek(ctx context.Context, key string) (Result, error) {
	return l.decide(ctx, modePeek, key, 1)
}

// Reset forgets key's state, giving it full capacity again.
func (l *Limiter) Reset(ctx context.Context, key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	err := l.call(ctx, func(ctx context.Context) error {
		return l.client.Del(ctx, l.Key(key)).Err()
	})
	if err != nil {
		return l.unavailable(ctx, err)
	}
	return nil
}

// decide validates a request and runs the policy's script for it.
func (l *Limiter) decide(ctx context.Context, mode, key string, n int) (Result, error) {
	switch {
	case key == "":
		return Result{}, fmt.Errorf("%w: empty key", ErrInvalidKey)
	case n < 1:
		return Result{}, fmt.Errorf("%w: n must be at least 1, got %d", ErrInvalidN, n)
	case n > l.spec.capacity:
		return Result{}, fmt.Errorf("%w: n = %d, capacity %d", ErrExceedsLimit, n, l.spec.capacity)
	}
	args := make([]any, 0, 2+len(l.spec.params))
	args = append(args, mode, strconv.Itoa(n))
	for _, p := range l.spec.params {
		args = append(args, p)
	}
	var reply []int64
	err := l.call(ctx, func(ctx context.Context) error {
		var err error
		reply, err = l.spec.script.Run(ctx, l.client, []string{l.Key(key)}, args...).Int64Slice()
		if err == nil && len(reply) != 5 {
			err = fmt.Errorf("script returned %d values, want 5", len(reply))
		}
		return err
	})
	if err != nil {
		if ctx.Err() == nil && mode == modeTake && l.cfg.failure == FailOpen {
			return Result{Allowed: true, Limit: l.spec.capacity, Degraded: true}, nil
		}
		return Result{}, l.unavailable(ctx, err)
	}
	return Result{
		Allowed:    reply[0] == 1,
		Limit:      l.spec.capacity,
		Remaining:  int(reply[1]),
		RetryAfter: time.Duration(reply[2]) * time.Microsecond,
		ResetAfter: time.Duration(reply[3]) * time.Microsecond,
		serverTime: reply[4],
	}, nil
}

// call runs one Redis exchange under the configured timeout. go-redis
// applies a context's deadline to socket reads only when the client was
// built with ContextTimeoutEnabled; for other clients a timed exchange runs
// in a goroutine of its own, so the caller is answered at the deadline while
// the exchange ends within the client's ReadTimeout. When call returns at
// the deadline fn may still be running, so the caller reads what fn writes
// only after call returned nil.
func (l *Limiter) call(ctx context.Context, fn func(context.Context) error) error {
	if l.cfg.timeout <= 0 {
		return fn(ctx)
	}
	timed, cancel := context.WithTimeout(ctx, l.cfg.timeout)
	defer cancel()
	var err error
	if l.deadlines {
		err = fn(timed)
	} else {
		done := make(chan error, 1)
		go func() { done <- fn(timed) }()
		select {
		case err = <-done:
		case <-timed.Done():
			err = timed.Err()
		}
	}
	if err != nil && ctx.Err() == nil && errors.Is(timed.Err(), context.DeadlineExceeded) && !errors.Is(err, context.DeadlineExceeded) {
		// The client reports its own timeout (a net error); say which
		// deadline passed.
		err = fmt.Errorf("%w after %s: %w", context.DeadlineExceeded, l.cfg.timeout, err)
	}
	return err
}

// honoursDeadlines reports whether c applies context deadlines to its
// socket reads.
func honoursDeadlines(c redis.UniversalClient) bool {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// unavailable wraps a failed call: the caller's own context error when the
// caller gave up, ErrUnavailable with the cause otherwise.
func (l *Limiter) unavailable(ctx context.Context, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return fmt.Errorf("throttle: %w", ctxErr)
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}
