package throttle

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/redis/go-redis/v9"
)

var blockScript = limiterScript("block")

// Limiter applies a [Policy] to any number of caller keys, keeping their
// state in Redis so that every process sharing the Redis shares the limit.
// Its policy can differ per key ([WithPlan]) and, with
// [WithLivePolicies], be changed while it runs ([PolicyStore]).
// Each decision is one Lua script, run atomically on the Redis server with
// the server's clock. A Limiter is safe for concurrent use; create one per
// limit (one name) and reuse it. The zero Limiter is not usable: call [New].
type Limiter struct {
	conn
	spec   spec       // the policy in code
	id     string     // names the limiter in its keys: name@kind
	live   *live      // the stored policies; nil unless WithLivePolicies
	plans  sync.Map   // Policy -> *spec, the plans WithPlan chose
	denied *denyCache // nil unless WithDenyCache
	shared *coalescer // nil unless WithCoalescing
	// skew is how far Redis's clock was seen ahead of this process's, in
	// µs: a Quota's periods are computed around the Redis time it implies.
	skew atomic.Int64
	// shares: nil unless WithLeasedShares
	shares *shares
}

// New returns the Limiter called name that applies p through client,
// which may be a *redis.Client, *redis.ClusterClient or *redis.Ring. It
// validates the name, policy and options and talks to no server.
//
// The name is the limiter's identity: its Redis keys hold its state under
// its name and algorithm, so limiters of one name (in this process or any
// other on the same Redis and prefix) share their state, and limiters of
// different names never do, whatever their policies. Decisions, logs and
// metrics carry it, and throttlectl and the dashboard show it. Keep names
// few (one per limit, such as "partner-api" or "emails-per-tenant"), never
// one per caller key; a name is not empty and holds no '{', '}' or '@'.
// Because the state is kept by name, a limiter's policy can change in code
// (a deploy) and keep what was consumed.
//
// Options and their defaults:
//
//	WithPrefix(s)          "throttle:"   start of every Redis key
//	WithTimeout(d)         0 (none)      bound on each decision
//	WithFailurePolicy(p)   FailClosed    what to do when Redis cannot answer
//	WithDenyCache(size)    0 (off)       answer repeated rejections locally
//	WithCoalescing(n)      64            share round trips between callers
//	WithObserver(o)        none          receives every decision
//	WithLivePolicies()     off           apply the policies stored for the name (PolicyStore)
//	WithPlan(f)            none          the policy of each caller key
//	WithLogger(l)          slog.Default  where Redis failures are logged
//	WithKeyHashing(over)   off           store long caller keys by hash
//	WithLeasedShares(d)    off           decide in memory from leased shares
//
// Errors wrap [ErrInvalidPolicy] or [ErrInvalidOption].
func New(client redis.UniversalClient, name string, p Policy, opts ...Option) (*Limiter, error) {
	if noPolicy(p) {
		return nil, fmt.Errorf("%w: nil policy", ErrInvalidPolicy)
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	sp := compiled(p)
	c, err := newConn(client, name, opts)
	if err != nil {
		return nil, err
	}
	if c.cfg.lease > 0 && !sp.reservable {
		return nil, fmt.Errorf("%w: WithLeasedShares applies to TokenBucket and GCRA, not %s", ErrInvalidOption, kindName(sp.kind))
	}
	l := &Limiter{conn: c, spec: *sp, id: name + "@" + sp.kind}
	if c.cfg.lease > 0 {
		l.shares = newShares(l, c.cfg.lease)
	}
	l.register(keyspace.Entry{Policy: sp.form, Live: c.cfg.live, Leased: c.cfg.lease > 0})
	if c.cfg.live {
		l.live = newLive(c.cfg.prefix, name, sp.kind)
	}
	if c.cfg.denyCache > 0 {
		l.denied = newDenyCache(c.cfg.denyCache)
	}
	if c.cfg.coalesce > 1 && sp.calendar == nil {
		l.shared = &coalescer{limit: c.cfg.coalesce, lanes: coalesceLanes}
	}
	return l, nil
}

// Policy returns the policy the Limiter was created with: the one in code,
// applied when no plan (WithPlan) and no stored policy (PolicyStore) says
// otherwise. PolicyFor says which applies to a key.
func (l *Limiter) Policy() Policy { return l.spec.policy }

// PolicyFor returns the policy in force for key now: the one stored for
// key, else the one stored for the limiter, else the plan's, else the one
// in code. It reads the stored policies only when the limiter has not read
// them for a while (see [PolicyStore]).
func (l *Limiter) PolicyFor(ctx context.Context, key string) (Policy, error) {
	sp, err := l.specFor(ctx, key)
	if err != nil {
		return nil, err
	}
	return sp.policy, nil
}

// specFor returns the spec of the policy in force for key.
func (l *Limiter) specFor(ctx context.Context, key string) (*spec, error) {
	if l.live != nil {
		set := l.live.current(ctx, &l.conn)
		if sp := set.keys[key]; sp != nil {
			return sp, nil
		}
		if set.all != nil {
			return set.all, nil
		}
	}
	var p Policy
	if l.cfg.plan != nil {
		p = l.cfg.plan(ctx, key)
	}
	if noPolicy(p) || p == l.spec.policy {
		return &l.spec, nil
	}
	if sp, ok := l.plans.Load(p); ok {
		return sp.(*spec), nil
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	sp := compiled(p)
	sp.source = SourcePlan
	if sp.kind != l.spec.kind {
		return nil, invalidPolicy("the plan for key %q is %s, the limiter is %s", key, kindName(sp.kind), kindName(l.spec.kind))
	}
	l.plans.Store(p, sp)
	return sp, nil
}

// Name returns the limiter's name, as given to New. Decisions carry it as
// Decision.Limiter.
func (l *Limiter) Name() string { return l.cfg.name }

// Key returns the Redis key holding the state of callerKey, for inspection
// and operations tools.
func (l *Limiter) Key(callerKey string) string {
	return l.cfg.redisKey(l.id, callerKey)
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
	var r Result
	var err error
	if l.shares != nil {
		r, err = l.shares.allow(ctx, l, key, n)
	} else {
		r, err = l.decide(ctx, modeTake, key, n)
	}
	l.observe(ctx, OpAllow, key, n, start, r, err)
	return r, err
}

// Close gives back the shares this process holds (WithLeasedShares) and
// stops renewing them; decisions after Close fail with [ErrClosed]. It
// waits for the renewal under way, within ctx. A Limiter without leased
// shares holds nothing: Close does nothing and returns nil. Close is safe
// for concurrent use; a second call does nothing.
func (l *Limiter) Close(ctx context.Context) error {
	if l.shares == nil {
		return nil
	}
	return l.shares.close(ctx, l)
}

// Peek reports what Allow would decide for key now, without consuming
// anything: Allowed, Remaining, RetryAfter for one unit and ResetAfter.
// Peek ignores the failure policy: when Redis cannot answer it returns an
// error wrapping [ErrUnavailable].
func (l *Limiter) Peek(ctx context.Context, key string) (Result, error) {
	start := l.began()
	var r Result
	var err error
	if l.shares != nil {
		r, err = l.shares.peek(ctx, l, key)
	} else {
		r, err = l.decide(ctx, modePeek, key, 1)
	}
	l.observe(ctx, OpPeek, key, 1, start, r, err)
	return r, err
}

// Reset forgets everything kept for key: its state, giving it full
// capacity again, its block, every ticketed booking made for it (the worker's),
// which no caller can claim afterwards, and what package worker keeps
// beside it (when its tasks started, and the tasks waiting for it).
func (l *Limiter) Reset(ctx context.Context, key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	if l.denied != nil {
		l.denied.forget(key)
	}
	if l.shares != nil {
		l.shares.dropLocal(key)
	}
	state := l.Key(key)
	return l.del(ctx, state, blockKey(state), state+keyspace.TicketsSuffix, state+sharesSuffix,
		state+startsSuffix, state+roomSuffix, state+waitersSuffix, state+flowsSuffix, state+heldSuffix, state+asideSuffix,
		state+dispatcherSuffix)
}

// Unblock lifts key's block (BlockFor) in every process. A window policy
// and a LeakyBucket keep the block beside the key's state, which then
// counts on as before. TokenBucket and GCRA keep a block inside the key's
// state, where it cannot be told apart from what was consumed: Unblock
// forgets their state, as Reset does.
// A key without a block is left as it is (a meter's state too).
func (l *Limiter) Unblock(ctx context.Context, key string) error {
	left, err := l.BlockedFor(ctx, key)
	if err != nil || left <= 0 {
		return err
	}
	if l.spec.reservable && l.shares == nil {
		return l.Reset(ctx, key)
	}
	if l.denied != nil {
		l.denied.forget(key)
	}
	return l.del(ctx, blockKey(l.Key(key)))
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
	if l.shares != nil {
		// The block is beside the shares: the rest admits nothing and no
		// share is granted while it holds; this process stops deciding
		// under its share now, the others at their next renewal.
		l.shares.dropLocal(key)
	}
	if l.spec.reservable && l.shares == nil {
		// The meters keep the block in their instant, so that decisions
		// need not look it up.
		var r reply
		var sp *spec
		if sp, err = l.specFor(ctx, key); err != nil {
			return err
		}
		r, err = l.run(ctx, sp, modeBlock, key, 1, itoa(max(1, d.Microseconds())))
		if err != nil {
			err = l.unavailable(ctx, err)
		}
		left = micros(r.v[2])
	} else {
		left, err = l.block(ctx, key, max(1, d.Microseconds()))
	}
	if err == nil && l.denied != nil {
		now := time.Now()
		l.denied.remember(key, 1, "", Result{RetryAfter: left, ResetAfter: left}, now) // a block holds whatever the policy
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
	sp, err := l.specFor(ctx, key)
	if err != nil {
		return Result{}, err
	}
	if err := validRequest(key, n, sp.capacity); err != nil {
		return Result{}, err
	}
	cached := mode == modeTake && l.denied != nil
	if cached {
		if r, ok := l.denied.lookup(key, n, sp.id, sp.capacity, time.Now()); ok {
			r.policy = sp
			return r, nil
		}
	}
	var reply reply
	if l.shared != nil {
		reply, err = l.shared.decide(ctx, l, sp, mode, n, key)
	} else {
		reply, err = l.run(ctx, sp, mode, key, n)
	}
	if err != nil {
		if mode == modeTake && l.failOpen(ctx, err) {
			return Result{Allowed: true, Limit: sp.capacity, Degraded: true, cause: err, policy: sp}, nil
		}
		return Result{}, l.unavailable(ctx, err)
	}
	r := resultOf(reply, sp.capacity)
	r.policy = sp
	if cached {
		l.note(key, n, sp, r)
	}
	return r, nil
}

// note keeps a rejection made under sp in the deny cache, or drops the
// key's entry after an admission.
func (l *Limiter) note(key string, n int, sp *spec, r Result) {
	if r.Allowed {
		l.denied.forget(key)
	} else {
		l.denied.remember(key, n, sp.id, r, time.Now())
	}
}

// run runs the script of sp for key: ARGV is the mode, n, the policy's
// parameters, then extra.
func (l *Limiter) run(ctx context.Context, sp *spec, mode int, key string, n int, extra ...string) (reply, error) {
	return l.runTicket(ctx, sp, mode, key, "", n, extra...)
}

// runTicket is run with a ticket key (KEYS[2] of the meters) when ticket is
// not empty.
// It allocates what it must and no more: the arguments are boxed once per
// policy (spec.args) and per small n (boxedN), and the state and block keys
// share one string.
func (l *Limiter) runTicket(ctx context.Context, sp *spec, mode int, key, ticket string, n int, extra ...string) (reply, error) {
	keys, args := l.scriptArgs(sp, mode, key, ticket, n, extra...)
	script := sp.script
	if sp.reservable && mode >= modeReserve {
		script = meterBookingScript
	}
	r, err := l.eval(ctx, script, keys, args)
	if err == nil && sp.calendar != nil && r.v[0] < 0 {
		// Redis's clock is further from ours than the periods given: learn
		// how far, and ask again with the periods around its time.
		l.skew.Store(r.v[4] - time.Now().UnixMicro())
		keys, args = l.scriptArgs(sp, mode, key, ticket, n, extra...)
		if r, err = l.eval(ctx, script, keys, args); err == nil && r.v[0] < 0 {
			err = fmt.Errorf("quota.lua: Redis's clock moved by more than a period between two calls")
		}
	}
	return r, err
}

// scriptArgs returns the keys and arguments of one call of the script of
// sp.
func (l *Limiter) scriptArgs(sp *spec, mode int, key, ticket string, n int, extra ...string) ([]string, []any) {
	if sp.calendar != nil && len(extra) == 0 {
		extra = noUndo
	}
	args := make([]any, 2+len(sp.args)+len(extra))
	args[0] = modeArgs[mode]
	args[1] = boxedN(n)
	copy(args[2:], sp.args)
	for i, e := range extra {
		args[2+len(sp.args)+i] = e
	}
	if sp.calendar != nil {
		args = append(args, sp.calendar(time.Now().Add(time.Duration(l.skew.Load())*time.Microsecond))...)
	}
	stateAndBlock := l.cfg.redisKeyWith(l.id, key, keyspace.BlockSuffix)
	state := stateAndBlock[:len(stateAndBlock)-len(keyspace.BlockSuffix)]
	var keys []string
	switch {
	case !sp.reservable:
		keys = []string{state, stateAndBlock} // the windows read the block
	case ticket != "" && mode == modeReserve:
		keys = []string{state, ticketKey(state, ticket), state + keyspace.TicketsSuffix}
	case ticket != "":
		keys = []string{state, ticketKey(state, ticket)}
	case mode == modeBlock:
		keys = []string{state, stateAndBlock}
	default:
		keys = []string{state} // a meter's block is in its instant
	}
	return keys, args
}

// noUndo stands for the undo arguments of a call that undoes nothing.
var noUndo = []string{"0", "0"}

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
