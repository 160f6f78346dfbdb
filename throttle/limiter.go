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
	denied *denyCache // nil unless WithDenyCache
	shared *coalescer // nil unless WithCoalescing
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
//	WithDenyCache(size)    0 (off)       answer repeated rejections locally
//	WithCoalescing(n)      64            share round trips between callers
//	WithObserver(o)        none          receives every decision
//	WithName(s)            policy's form name in decisions, logs, metrics
//	WithLogger(l)          slog.Default  where Redis failures are logged
//	WithKeyHashing(over)   off           store long caller keys by hash
//
// Errors wrap [ErrInvalidPolicy] or [ErrInvalidOption].
func New(client redis.UniversalClient, p Policy, opts ...Option) (*Limiter, error) {
	if p == nil {
		return nil, fmt.Errorf("%w: nil policy", ErrInvalidPolicy)
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	sp := p.spec()
	c, err := newConn(client, sp.id, opts)
	if err != nil {
		return nil, err
	}
	l := &Limiter{conn: c, policy: p, spec: sp}
	if c.cfg.denyCache > 0 {
		l.denied = newDenyCache(c.cfg.denyCache)
	}
	if c.cfg.coalesce > 1 {
		l.shared = &coalescer{limit: c.cfg.coalesce, lanes: coalesceLanes}
	}
	return l, nil
}

// Policy returns the policy the Limiter applies.
func (l *Limiter) Policy() Policy { return l.policy }

// Key returns the Redis key holding the state of callerKey, for inspection
// and operations tools.
func (l *Limiter) Key(callerKey string) string {
	return l.cfg.redisKey(l.spec.id, callerKey)
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
	start := l.began()
	r, err := l.decide(ctx, modeTake, key, n)
	l.observe(ctx, OpAllow, key, n, start, r, err)
	return r, err
}

// Peek reports what Allow would decide for key now, without consuming
// anything: Allowed, Remaining, RetryAfter for one unit and ResetAfter.
// Peek ignores the failure policy: when Redis cannot answer it returns an
// error wrapping [ErrUnavailable].
func (l *Limiter) Peek(ctx context.Context, key string) (Result, error) {
	start := l.began()
	r, err := l.decide(ctx, modePeek, key, 1)
	l.observe(ctx, OpPeek, key, 1, start, r, err)
	return r, err
}

// Reset forgets everything kept for key: its state, giving it full
// capacity again, its block, every booking made for it with ReserveFor,
// which no caller can claim afterwards, and what package worker keeps
// beside it (when its tasks started, and the tasks waiting for it).
func (l *Limiter) Reset(ctx context.Context, key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	if l.denied != nil {
		l.denied.forget(key)
	}
	state := l.Key(key)
	return l.del(ctx, state, blockKey(state), state+ticketsSuffix,
		state+startsSuffix, state+roomSuffix, state+waitersSuffix, state+flowsSuffix, state+heldSuffix, state+asideSuffix)
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
	var left time.Duration
	var err error
	if l.spec.reservable {
		// The meters keep the block in their instant, so that decisions
		// need not look it up.
		var r reply
		r, err = l.run(ctx, modeBlock, key, 1, itoa(max(1, d.Microseconds())))
		if err != nil {
			err = l.unavailable(ctx, err)
		}
		left = micros(r.v[2])
	} else {
		left, err = l.block(ctx, key, max(1, d.Microseconds()))
	}
	if err == nil && l.denied != nil {
		now := time.Now()
		l.denied.remember(key, 1, Result{RetryAfter: left, ResetAfter: left}, now)
	}
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
	if err == nil && reply.n < 1 {
		err = fmt.Errorf("block script returned %d values", reply.n)
	}
	if err != nil {
		return 0, l.unavailable(ctx, err)
	}
	return micros(reply.v[0]), nil
}

// decide validates a request and runs the policy's script for it.
func (l *Limiter) decide(ctx context.Context, mode int, key string, n int) (Result, error) {
	if err := validRequest(key, n, l.spec.capacity); err != nil {
		return Result{}, err
	}
	cached := mode == modeTake && l.denied != nil
	if cached {
		if r, ok := l.denied.lookup(key, n, l.spec.capacity, time.Now()); ok {
			return r, nil
		}
	}
	var reply reply
	var err error
	if l.shared != nil {
		reply, err = l.shared.decide(ctx, l, mode, n, key)
	} else {
		reply, err = l.run(ctx, mode, key, n)
	}
	if err != nil {
		if mode == modeTake && l.failOpen(ctx, err) {
			return Result{Allowed: true, Limit: l.spec.capacity, Degraded: true, cause: err}, nil
		}
		return Result{}, l.unavailable(ctx, err)
	}
	r := resultOf(reply, l.spec.capacity)
	if cached {
		l.note(key, n, r)
	}
	return r, nil
}

// note keeps a rejection in the deny cache, or drops the key's entry after
// an admission.
func (l *Limiter) note(key string, n int, r Result) {
	if r.Allowed {
		l.denied.forget(key)
	} else {
		l.denied.remember(key, n, r, time.Now())
	}
}

// run runs the policy's script for key: ARGV is the mode, n, the policy's
// parameters, then extra.
func (l *Limiter) run(ctx context.Context, mode int, key string, n int, extra ...string) (reply, error) {
	return l.runTicket(ctx, mode, key, "", n, extra...)
}

// runTicket is run with a ticket key (KEYS[2] of the meters) when ticket is
// not empty.
// It allocates what it must and no more: the arguments are boxed once per
// policy (spec.args) and per small n (boxedN), and the state and block keys
// share one string.
func (l *Limiter) runTicket(ctx context.Context, mode int, key, ticket string, n int, extra ...string) (reply, error) {
	keys, args := l.scriptArgs(mode, key, ticket, n, extra...)
	script := l.spec.script
	if l.spec.reservable && mode >= modeReserve {
		script = meterBookingScript
	}
	return l.eval(ctx, script, keys, args)
}

// scriptArgs returns the keys and arguments of one call of the policy's
// script.
func (l *Limiter) scriptArgs(mode int, key, ticket string, n int, extra ...string) ([]string, []any) {
	args := make([]any, 2+len(l.spec.args)+len(extra))
	args[0] = modeArgs[mode]
	args[1] = boxedN(n)
	copy(args[2:], l.spec.args)
	for i, e := range extra {
		args[2+len(l.spec.args)+i] = e
	}
	stateAndBlock := l.cfg.redisKeyWith(l.spec.id, key, blockSuffix)
	state := stateAndBlock[:len(stateAndBlock)-len(blockSuffix)]
	var keys []string
	switch {
	case !l.spec.reservable:
		keys = []string{state, stateAndBlock} // the windows read the block
	case ticket != "" && mode == modeReserve:
		keys = []string{state, ticketKey(state, ticket), state + ticketsSuffix}
	case ticket != "":
		keys = []string{state, ticketKey(state, ticket)}
	case mode == modeBlock:
		keys = []string{state, stateAndBlock}
	default:
		keys = []string{state} // a meter's block is in its instant
	}
	return keys, args
}

// smallN holds the decimal forms of small unit counts, boxed once.
var smallN = func() (boxed [256]any) {
	for i := range boxed {
		boxed[i] = strconv.Itoa(i)
	}
	return boxed
}()

// boxedN returns n's decimal form as a script argument.
func boxedN(n int) any {
	if n >= 0 && n < len(smallN) {
		return smallN[n]
	}
	return strconv.Itoa(n)
}

// micros converts a script's microseconds to a Duration.
func micros(us int64) time.Duration { return time.Duration(us) * time.Microsecond }
