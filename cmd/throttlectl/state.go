package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/jobthrottle/jobthrottle/internal/lease"
	"github.com/jobthrottle/jobthrottle/internal/waitroom"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// limiter is a rate limiter or a concurrency limiter, seen one way.
type limiter struct {
	id     string                       // name@algorithm, as in its keys
	name   string                       // the limiter's name
	rate   *throttle.Limiter            // nil for a concurrency cap
	conc   *throttle.ConcurrencyLimiter // nil for a rate policy
	spec   policy                       // the policy it was made with
	client redis.UniversalClient
}

// newLimiter returns the library's limiter for p under prefix. It logs
// nothing: throttlectl reports failures itself.
func newLimiter(client redis.UniversalClient, prefix string, p policy) (*limiter, error) {
	opts := []throttle.Option{throttle.WithPrefix(prefix), throttle.WithLogger(slog.New(slog.DiscardHandler)),
		keyspace.Inspecting.(throttle.Option)}
	l := &limiter{client: client, name: p.name, spec: p}
	if p.leased {
		opts = append(opts, throttle.WithLeasedShares(0)) // reads the shares' rest; holds none
	}
	if p.live && p.rate != nil {
		opts = append(opts, throttle.WithLivePolicies()) // a key's own stored policy too, as its processes apply it
	}
	var err error
	if p.rate != nil {
		l.rate, err = throttle.New(client, p.name, p.rate, opts...)
	} else {
		l.conc, err = throttle.NewConcurrencyLimiter(client, p.name, p.conc, opts...)
	}
	if err != nil {
		return nil, usageError{err}
	}
	// The policy as the library writes it, whatever form it was given in.
	info, err := parseKey(prefix, l.key("x"))
	if err != nil {
		return nil, fmt.Errorf("reading back the limiter's own key: %w", err)
	}
	l.id = limiterID(info)
	return l, nil
}

// key returns the Redis key of caller's state.
func (l *limiter) key(caller string) string {
	if l.rate != nil {
		return l.rate.Key(caller)
	}
	return l.conc.Key(caller)
}

// state is one key's state, as peek and top show it.
type state struct {
	caller      string
	redisKey    string
	policy      string   // in force
	source      string   // where policy comes from (see policy.source)
	rules       []string // the worker's rules that use the limiter
	absent      bool     // no state in Redis: the key is full
	name        string   // a named limiter's name
	concurrency bool
	limits      limits // the policy's rate and burst, or limit and window
	allowed     bool   // one unit (one slot) would be admitted now
	limit       int
	remaining   int // units (free slots) left now
	retryAfter  time.Duration
	resetAfter  time.Duration
	blockedFor  time.Duration
	// The worker's tasks in the key's waiting room (a TokenBucket or GCRA
	// key of a FairBy, several-rule or live rule): how many, by flow, and
	// when the last is expected to start.
	waiting      int
	flows        []waitroom.Flow
	expectedWait time.Duration
	// The shares of the key's rate leased to processes (WithLeasedShares),
	// and what they leave: nil unless the limiter leases.
	shares *lease.State
}

// throttled reports a key that admits nothing now, or whose tasks wait.
func (s state) throttled() bool { return !s.allowed || s.blockedFor > 0 || s.waiting > 0 }

// wait is how long until the key admits a unit again, or until its last
// waiting task is expected to start.
func (s state) wait() time.Duration { return max(s.retryAfter, s.blockedFor, s.expectedWait) }

// holders is a concurrency cap's holders now.
func (s state) holders() int { return s.limit - s.remaining }

// peek reads caller's state without changing it.
func (l *limiter) peek(ctx context.Context, caller string) (state, error) {
	s := state{caller: caller, redisKey: l.key(caller), policy: l.id, source: l.spec.source, rules: l.spec.rules, name: l.name, concurrency: l.conc != nil}
	var r throttle.Result
	var err error
	if l.conc != nil {
		s.policy = fmt.Sprintf("conc:%d/%s", l.spec.conc.Limit, l.spec.conc.Lease)
		s.limits = concurrencyLimits(l.spec.conc)
		r, err = l.conc.Peek(ctx, caller)
	} else {
		p := l.spec.rate
		if inForce, err := l.rate.PolicyFor(ctx, caller); err == nil {
			if inForce.String() != p.String() {
				s.source = "stored" // the key's own
			}
			p = inForce
		}
		s.policy, s.limits = p.String(), limitsOf(p)
		r, err = l.rate.Peek(ctx, caller)
		if err == nil {
			s.blockedFor, err = l.rate.BlockedFor(ctx, caller)
		}
	}
	if err != nil {
		return state{}, fmt.Errorf("peeking %q: %w", s.redisKey, err)
	}
	s.allowed, s.limit, s.remaining = r.Allowed, r.Limit, r.Remaining
	s.retryAfter, s.resetAfter = r.RetryAfter, r.ResetAfter
	if l.spec.leased && l.rate != nil {
		if err := l.readShares(ctx, &s); err != nil {
			return state{}, fmt.Errorf("reading the shares of %q: %w", s.redisKey, err)
		}
	}
	if l.rate != nil && waitroom.Interval(l.spec.rate) > 0 && !l.spec.leased {
		if err := l.readWaiting(ctx, &s); err != nil {
			return state{}, fmt.Errorf("reading the waiting room of %q: %w", s.redisKey, err)
		}
	}
	return s, nil
}

// readWaiting reads the worker's waiting room of a meter key into s: one
// round trip when it is empty.
func (l *limiter) readWaiting(ctx context.Context, s *state) error {
	pipe := l.client.Pipeline()
	room := pipe.ZCard(ctx, s.redisKey+keyspace.RoomSuffix)
	aside := pipe.ZCard(ctx, s.redisKey+keyspace.AsideSuffix)
	if _, err := pipe.Exec(ctx); err != nil {
		return err
	}
	if s.waiting = int(room.Val() + aside.Val()); s.waiting == 0 {
		return nil
	}
	p, err := throttle.ParsePolicy(s.policy)
	if err != nil {
		return err
	}
	now, err := l.client.Time(ctx).Result()
	if err != nil {
		return err
	}
	r, err := waitroom.Read(ctx, l.client, s.redisKey, p, s.retryAfter, now)
	s.waiting, s.flows, s.expectedWait = r.Waiting, r.Flows, r.ExpectedWait
	return err
}

// readShares reads the shares leased of s's key and their rest into s.
func (l *limiter) readShares(ctx context.Context, s *state) error {
	st, ok, err := lease.ReadKey(ctx, l.client, s.redisKey, s.policy)
	if ok {
		s.shares = &st
	}
	return err
}

// present reports whether s, just peeked, has anything in Redis: its state
// key (its shares' key, for a limiter that leases), or a block (which a
// window policy keeps beside its state).
func (l *limiter) present(ctx context.Context, s state) (bool, error) {
	if s.blockedFor > 0 {
		return true, nil
	}
	key := s.redisKey
	if l.spec.leased {
		key += keyspace.SharesSuffix
	}
	n, err := l.client.Exists(ctx, key).Result()
	if err != nil {
		return false, fmt.Errorf("looking up %q: %w", s.redisKey, err)
	}
	return n > 0, nil
}

// reset forgets caller's state and lifts its block; on a concurrency cap
// it drops every holder.
func (l *limiter) reset(ctx context.Context, caller string) error {
	var err error
	if l.conc != nil {
		err = l.conc.Reset(ctx, caller)
	} else {
		err = l.rate.Reset(ctx, caller)
	}
	if err != nil {
		return fmt.Errorf("resetting %q: %w", l.key(caller), err)
	}
	return nil
}
