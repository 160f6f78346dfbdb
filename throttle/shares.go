package throttle

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/jobthrottle/jobthrottle/internal/lease"
)

// WithLeasedShares makes a TokenBucket or GCRA limiter decide most
// requests in this process, without a Redis call: each process that asks
// a key often (5 units a second or more) is granted a share of the key's
// rate and burst for a lease, and decides within it in memory; the others,
// and a process whose share is spent or not yet granted, are decided in
// Redis from what the shares leave. Shares are renewed in the background
// every half lease, off the decision path, and follow each process's
// demand: max-min fair between the processes that want more than an equal
// part. The shares in force and the rest never add up to more than the
// policy's rate and burst, so the fleet stays within the policy, whoever
// decides.
//
// lease is how long a share lasts (0: 1.5 s). A process that dies or loses
// Redis gives its share up when its lease ends; live policy changes and
// blocks (BlockFor) reach a process holding a share at its next renewal,
// within half a lease. Every process using the limiter's name must use
// this option: the keys it decides are not the ones a limiter without it
// uses. Reserve is not available (it fails with [ErrNotSupported]), and
// WaitN sleeps on each rejection's RetryAfter. Call [Limiter.Close] to
// give this process's shares back when done. See "Leased shares" in
// docs/limiters.md for when it pays.
func WithLeasedShares(lease time.Duration) Option {
	return optionFunc(func(c *config) error {
		if lease < 0 || (lease > 0 && lease < minLease) || lease > maxLease {
			return fmt.Errorf("%w: a lease lasts from %s to %s (0: %s), got %s", ErrInvalidOption, minLease, maxLease, defaultLease, lease)
		}
		if lease == 0 {
			lease = defaultLease
		}
		c.lease = lease
		return nil
	})
}

const (
	defaultLease = 1500 * time.Millisecond
	minLease     = 100 * time.Millisecond
	maxLease     = time.Minute
	// leaseAbove is the demand, units per second, from which a process
	// asks for a share; below it, decisions go to Redis as without leases.
	leaseAbove = 5
	// leasePad is how much more than its measured demand a process asks
	// for, so that a growing demand is not held back until the next renewal.
	leasePad = 1.25
	// againMargin is how long after another's grant stops counting (on
	// Redis's clock) a holder held below its part asks again.
	againMargin = 5 * time.Millisecond
	// sharesSuffix ends the Redis key of a key's shares and rest.
	sharesSuffix = keyspace.SharesSuffix
)

// shares is a Limiter's side of WithLeasedShares: a share per caller key
// in use, and the goroutine that renews them.
type shares struct {
	store  *lease.Store
	holder string
	lease  time.Duration
	mu     sync.RWMutex
	keys   map[string]*keyShare
	start  sync.Once
	stop   chan struct{}
	done   chan struct{}
	fresh  chan struct{} // a key was first used: ask for its share soon
	closed atomic.Bool
}

// keyShare is one caller key's share in this process.
type keyShare struct {
	share lease.Share
	keys  lease.Keys
	// asking: this process holds or asked for a share, so its demand is
	// counted as its own rather than the rest's
	asking atomic.Bool
	// unasked counts the units asked of the rest while not asking, since
	// the last request for a share (lease.Ask.Unasked)
	unasked atomic.Int64
	spec    atomic.Pointer[spec] // the policy the share was granted under
	// owned by the renewing goroutine:
	demand float64 // units per second asked since the last renewal
	last   int64   // when the last renewal was sent (monotonic ns)
	due    int64   // when to ask again before the usual renewal (Grant.Again); 0: none
	// next is when the renewing goroutine asks for this key's share next
	// (monotonic ns), read by decisions to say when to come back
	next atomic.Int64
	idle int // renewals in a row with no demand and no share
}

// monoBase anchors the monotonic clock Shares run on.
var monoBase = time.Now()

// mono returns nanoseconds on this process's monotonic clock.
func mono() int64 { return int64(time.Since(monoBase)) }

func newShares(l *Limiter, d time.Duration) *shares {
	var id [6]byte
	_, _ = rand.Read(id[:])
	host, _ := os.Hostname()
	return &shares{
		store:  lease.NewStore(l.client),
		holder: fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(id[:])),
		lease:  d,
		keys:   map[string]*keyShare{},
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
		fresh:  make(chan struct{}, 1),
	}
}

// entry returns key's share, made on first use.
func (s *shares) entry(l *Limiter, key string) *keyShare {
	s.mu.RLock()
	ks := s.keys[key]
	s.mu.RUnlock()
	if ks != nil {
		return ks
	}
	s.start.Do(func() { go s.renew(l) })
	s.mu.Lock()
	defer s.mu.Unlock()
	if ks = s.keys[key]; ks == nil {
		// First renewed firstAsk from now: its demand by then says
		// whether a share is worth asking for.
		ks = &keyShare{keys: shareKeys(l, key), last: mono() - int64(s.lease/2-s.firstAsk())}
		ks.next.Store(ks.last + int64(s.lease/2))
		select {
		case s.fresh <- struct{}{}:
		default:
		}
		s.keys[key] = ks
	}
	return ks
}

// shareKeys returns the Redis keys of key's shares and of its block.
func shareKeys(l *Limiter, key string) lease.Keys {
	state := l.cfg.redisKeyWith(l.id, key, sharesSuffix)
	return lease.Keys{State: state, Block: blockKey(state[:len(state)-len(sharesSuffix)])}
}

// leasePolicy is sp's rate and burst as the lease script takes them.
func leasePolicy(sp *spec) lease.Policy {
	p, _ := leasePolicyOf(sp.policy)
	return p
}

// leasePolicyOf is p's rate and burst as the lease script takes them;
// false for a policy that leases nothing.
func leasePolicyOf(p Policy) (lease.Policy, bool) {
	switch p := p.(type) {
	case TokenBucket:
		return lease.Policy{Rate: float64(p.Rate.N) / p.Rate.Per.Seconds(), Burst: p.Burst}, true
	case GCRA:
		return lease.Policy{Rate: float64(p.Rate.N) / p.Rate.Per.Seconds(), Burst: p.Burst}, true
	}
	return lease.Policy{}, false
}

func init() {
	lease.PolicyOf = func(policy string) (lease.Policy, bool) {
		p, err := ParsePolicy(policy)
		if err != nil {
			return lease.Policy{}, false
		}
		return leasePolicyOf(p)
	}
}

// allow decides n units for key: in memory under this process's share
// when one is in force, else by the rest in Redis.
func (s *shares) allow(ctx context.Context, l *Limiter, key string, n int) (Result, error) {
	if s.closed.Load() {
		return Result{}, ErrClosed
	}
	ks := s.entry(l, key)
	if sp := ks.spec.Load(); sp != nil {
		if err := validRequest(key, n, sp.capacity); err != nil {
			return Result{}, err
		}
		// A refusal of a share granted all the demand it asked for is a
		// clump of arrivals, and a request larger than the share's burst
		// never fits it: the rest may have room for either.
		if d := ks.share.Take(mono(), float64(n)); d.Held && (d.OK || (!d.Full && float64(n) <= d.Burst)) {
			return localResult(d, n, sp), nil
		}
	}
	sp, err := l.specFor(ctx, key)
	if err != nil {
		return Result{}, err
	}
	if err := validRequest(key, n, sp.capacity); err != nil {
		return Result{}, err
	}
	if ks.spec.Load() == nil {
		ks.share.Take(mono(), float64(n)) // counts in the demand
	}
	if !sp.reservable {
		// A stored policy of another kind: decided as without leases.
		return l.decide(ctx, modeTake, key, n)
	}
	l.noteUse()
	var d lease.Decision
	asking := ks.asking.Load()
	if !asking {
		ks.unasked.Add(int64(n))
	}
	err = l.call(ctx, func(ctx context.Context) error {
		var err error
		d, err = s.store.TakeRest(ctx, ks.keys, leasePolicy(sp), n, asking)
		return err
	})
	if err != nil {
		if l.failOpen(ctx, err) {
			return Result{Allowed: true, Limit: sp.capacity, Degraded: true, cause: err, policy: sp}, nil
		}
		return Result{}, l.unavailable(ctx, err)
	}
	if !d.Allowed && asking {
		// This process asked for a share and holds none yet (or its share
		// is spent): it may hold one at its next request, sooner than the
		// rest has room.
		if until := time.Duration(ks.next.Load()-mono()) + againMargin; until > 0 && until < d.RetryAfter {
			d.RetryAfter = until
		}
	}
	return Result{Allowed: d.Allowed, Limit: sp.capacity, Remaining: d.Remaining, RetryAfter: d.RetryAfter,
		serverTime: d.At.UnixMicro(), policy: sp}, nil
}

// peek reports what allow would decide for one unit of key, consuming
// nothing: the share's view when this process holds one, else the rest's.
func (s *shares) peek(ctx context.Context, l *Limiter, key string) (Result, error) {
	sp, err := l.specFor(ctx, key)
	if err != nil {
		return Result{}, err
	}
	if err := validRequest(key, 1, sp.capacity); err != nil {
		return Result{}, err
	}
	s.mu.RLock()
	ks := s.keys[key]
	s.mu.RUnlock()
	if ks != nil {
		if held := ks.spec.Load(); held != nil {
			if d := ks.share.Peek(mono(), 1); d.Held {
				return localResult(d, 1, held), nil
			}
		}
	}
	var st lease.State
	err = l.call(ctx, func(ctx context.Context) error {
		var err error
		st, err = s.store.Read(ctx, shareKeys(l, key), leasePolicy(sp))
		return err
	})
	if err != nil {
		return Result{}, l.unavailable(ctx, err)
	}
	r := Result{Allowed: st.RestTokens >= 1, Limit: sp.capacity, Remaining: int(st.RestTokens), serverTime: st.At.UnixMicro(), policy: sp}
	if st.RestRate > 0 {
		r.ResetAfter = ceilDuration((st.RestBurst - st.RestTokens) / st.RestRate)
		if !r.Allowed {
			r.RetryAfter = ceilDuration((1 - st.RestTokens) / st.RestRate)
		}
	}
	return r, nil
}

// localResult is the Result of a decision made under a share.
func localResult(d lease.Local, n int, sp *spec) Result {
	r := Result{Allowed: d.OK, Limit: sp.capacity, Remaining: int(d.Tokens), Leased: true, policy: sp}
	if d.Rate > 0 {
		r.ResetAfter = ceilDuration((d.Burst - d.Tokens) / d.Rate)
		if !d.OK {
			r.RetryAfter = max(time.Microsecond, ceilDuration((float64(n)-d.Tokens)/d.Rate))
		}
	}
	return r
}

// ceilDuration converts seconds to a Duration, rounded up to the
// microsecond.
func ceilDuration(seconds float64) time.Duration {
	if seconds <= 0 {
		return 0
	}
	return time.Duration(math.Ceil(seconds*1e6)) * time.Microsecond
}

// renew runs until Close: every sixteenth of a lease, and firstAsk after
// a key's first decision, it renews the shares due (each every half
// lease, or sooner when Redis said another's grant stops counting
// sooner), asks for one where demand has grown, gives back those no
// longer worth holding, and forgets keys left idle.
func (s *shares) renew(l *Limiter) {
	defer close(s.done)
	tick := time.NewTicker(s.lease / 16)
	defer tick.Stop()
	first := time.NewTimer(time.Hour)
	defer first.Stop()
	var due []string
	for {
		select {
		case <-s.stop:
			return
		case <-s.fresh:
			first.Reset(s.firstAsk() + time.Millisecond)
			continue
		case <-first.C:
		case <-tick.C:
		}
		now := mono()
		due = due[:0]
		s.mu.RLock()
		for key, ks := range s.keys {
			if now-ks.last >= int64(s.lease/2) || (ks.due != 0 && now >= ks.due) {
				due = append(due, key)
			}
		}
		s.mu.RUnlock()
		for _, key := range due {
			s.renewKey(l, key)
		}
	}
}

// firstAsk is how long after its first decision a key's share is first
// asked for: long enough to measure its demand, short enough that little
// of it goes to Redis meanwhile.
func (s *shares) firstAsk() time.Duration { return max(10*time.Millisecond, s.lease/64) }

// renewKey renews key's share, asks for one, gives it back or forgets the
// key, as its demand says.
func (s *shares) renewKey(l *Limiter, key string) {
	s.mu.RLock()
	ks := s.keys[key]
	s.mu.RUnlock()
	now := mono()
	ks.last, ks.due = now, 0
	// The demand of the half lease since the last renewal, unsmoothed: a
	// share follows a change of demand at the next renewal (smoothed over
	// renewals, a flood's end kept its share for seconds that the others
	// then lacked).
	ks.demand = ks.share.Demand(now)
	held := ks.share.Held(now)
	ctx, cancel := context.WithTimeout(context.Background(), s.lease/2)
	defer cancel()
	sp, err := l.specFor(ctx, key)
	if err != nil {
		return // the share, if any, runs out at its lease's end
	}
	if sp.reservable && ks.demand >= leaseAbove {
		l.noteUse() // the registry of names, which decisions in memory do not reach
		ks.asking.Store(true)
		ask := lease.Ask{Demand: leasePad * ks.demand, Lease: s.lease, Least: 1, Unasked: float64(ks.unasked.Swap(0))}
		began := l.began()
		var g lease.Grant
		err = l.call(ctx, func(ctx context.Context) error {
			var err error
			g, err = s.store.Grant(ctx, ks.keys, s.holder, leasePolicy(sp), ask)
			return err
		})
		if err != nil {
			// The share runs out at its lease's end.
			l.observe(ctx, OpShare, key, 0, began, Result{}, l.unavailable(ctx, err))
			return
		}
		ks.spec.Store(sp)
		ks.share.Apply(g, now, mono())
		// Wanting too little for a share, its requests are the rest's
		// demand, which the others' shares leave room for.
		ks.asking.Store(!g.Small)
		if g.Again > 0 && g.Again < s.lease/2 {
			// Held below its part by a grant that stops counting sooner
			// than the next renewal: ask again just after it does.
			ks.due = mono() + int64(g.Again+againMargin)
		}
		ks.next.Store(now + int64(s.lease/2))
		if ks.due != 0 {
			ks.next.Store(ks.due)
		}
		l.observe(ctx, OpShare, key, 0, began, Result{Allowed: g.Rate > 0, Limit: sp.capacity, serverTime: g.At.UnixMicro(), policy: sp}, nil)
		return
	}
	ks.asking.Store(false)
	if held {
		ks.share.Stop()
		_ = l.call(ctx, func(ctx context.Context) error {
			return s.store.Release(ctx, ks.keys, s.holder, leasePolicy(ks.spec.Load()))
		})
		return
	}
	if ks.demand < 0.01 {
		if ks.idle++; ks.idle >= 4 {
			s.mu.Lock()
			delete(s.keys, key)
			s.mu.Unlock()
		}
	} else {
		ks.idle = 0
	}
}

// giveBack returns n units of key admitted in memory (a Result with
// Leased set) to this process's share.
func (s *shares) giveBack(key string, n int) {
	s.mu.RLock()
	ks := s.keys[key]
	s.mu.RUnlock()
	if ks != nil {
		ks.share.Give(mono(), float64(n))
	}
}

// dropLocal ends key's share in this process at once (a block or a reset
// made here must not wait for the next renewal).
func (s *shares) dropLocal(key string) {
	s.mu.RLock()
	ks := s.keys[key]
	s.mu.RUnlock()
	if ks != nil {
		ks.share.Stop()
	}
}

// close stops the renewals and gives every share back.
func (s *shares) close(ctx context.Context, l *Limiter) error {
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	started := true
	s.start.Do(func() { started = false }) // never started: nothing to stop
	close(s.stop)
	if started {
		select {
		case <-s.done:
		case <-ctx.Done():
			return fmt.Errorf("throttle: close: %w", ctx.Err())
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var first error
	for _, ks := range s.keys {
		held := ks.share.Held(mono())
		ks.share.Stop()
		if sp := ks.spec.Load(); held && sp != nil {
			err := l.call(ctx, func(ctx context.Context) error {
				return s.store.Release(ctx, ks.keys, s.holder, leasePolicy(sp))
			})
			if err != nil && first == nil {
				first = l.unavailable(ctx, err)
			}
		}
	}
	return first
}
