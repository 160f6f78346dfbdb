package throttle

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jobthrottle/jobthrottle/lua"
	"github.com/redis/go-redis/v9"
)

var blockScript = redis.NewScript(lua.Source(lua.Block))

// Limiter applies one [Policy] to any number of caller keys, keeping their
// state in Redis so that every process sharing the Redis shares the limit.
// Each decision is one Lua script, run atomically on the Redis server with
// the server's clock. A Limiter is safe for concurrent use; create one per
// policy and reuse it. The zero Limiter is not usable: call [New].
type Limiter struct {
	conn
	policy Policy
	spec   spec
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
	if p == nil {
		return nil, fmt.Errorf("%w: nil policy", ErrInvalidPolicy)
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	c, err := newConn(client, opts)
	if err != nil {
		return nil, err
	}
	return &Limiter{conn: c, policy: p, spec: p.spec()}, nil
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

// Reset forgets key's state, giving it full capacity again, and lifts its
// block.
func (l *Limiter) Reset(ctx context.Context, key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	state := l.Key(key)
	return l.del(ctx, state, blockKey(state))
}

// BlockFor stops key admitting anything for d, in every process sharing
// the Redis: the fleet-wide backoff after an upstream answered 429 with a
// Retry-After. d counts from the Redis server's clock; a block already
// ending later is kept. While blocked, decisions are rejections whose
// RetryAfter is the time left; on TokenBucket and GCRA the first unit after
// the block is admitted when it ends, then the rate applies (no burst), and
// Reserve books slots after it. d must be positive and at most ten years
// ([ErrInvalidDelay]).
func (l *Limiter) BlockFor(ctx context.Context, key string, d time.Duration) error {
	if key == "" {
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	if d <= 0 || d > maxSpan {
		return fmt.Errorf("%w: a block lasts from 1µs to %s, got %s", ErrInvalidDelay, maxSpan, d)
	}
	_, err := l.block(ctx, key, max(1, d.Microseconds()))
	return err
}

// BlockedFor reports how long key's block (see BlockFor) still holds: 0
// when it is not blocked.
func (l *Limiter) BlockedFor(ctx context.Context, key string) (time.Duration, error) {
	if key == "" {
		return 0, fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	return l.block(ctx, key, 0)
}

// block runs block.lua: blocks key for us microseconds (0: only asks) and
// returns how long the block holds.
func (l *Limiter) block(ctx context.Context, key string, us int64) (time.Duration, error) {
	reply, err := l.evalAny(ctx, blockScript, []string{blockKey(l.Key(key))}, []any{itoa(us)})
	if err == nil && len(reply) < 1 {
		err = fmt.Errorf("block script returned %d values", len(reply))
	}
	if err != nil {
		return 0, l.unavailable(ctx, err)
	}
	return micros(reply[0]), nil
}

// decide validates a request and runs the policy's script for it.
func (l *Limiter) decide(ctx context.Context, mode, key string, n int) (Result, error) {
	if err := validRequest(key, n, l.spec.capacity); err != nil {
		return Result{}, err
	}
	reply, err := l.run(ctx, mode, key, n)
	if err != nil {
		if mode == modeTake && l.failOpen(ctx) {
			return Result{Allowed: true, Limit: l.spec.capacity, Degraded: true}, nil
		}
		return Result{}, l.unavailable(ctx, err)
	}
	return resultOf(reply, l.spec.capacity), nil
}

// run runs the policy's script for key: ARGV is the mode, n, the policy's
// parameters, then extra.
func (l *Limiter) run(ctx context.Context, mode, key string, n int, extra ...string) ([]int64, error) {
	return l.runTicket(ctx, mode, key, "", n, extra...)
}

// runTicket is run with a ticket key as KEYS[2] when ticket is not empty.
func (l *Limiter) runTicket(ctx context.Context, mode, key, ticket string, n int, extra ...string) ([]int64, error) {
	args := make([]any, 0, 2+len(l.spec.params)+len(extra))
	args = append(args, mode, strconv.Itoa(n))
	for _, p := range l.spec.params {
		args = append(args, p)
	}
	for _, e := range extra {
		args = append(args, e)
	}
	stateKey := l.Key(key)
	keys := []string{stateKey, blockKey(stateKey)}
	if ticket != "" {
		keys = append(keys, ticketKey(stateKey, ticket))
	}
	return l.eval(ctx, l.spec.script, keys, args)
}

// micros converts a script's microseconds to a Duration.
func micros(us int64) time.Duration { return time.Duration(us) * time.Microsecond }
