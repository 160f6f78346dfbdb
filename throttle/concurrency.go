package throttle

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/redis/go-redis/v9"
)

var concurrencyScript = limiterScript("concurrency")

// Concurrency allows at most Limit holders of a key at once, across every
// process sharing the Redis: a fleet-wide cap on work in flight, such as
// "3 exports of a tenant at a time". Each holder has a lease of Lease that
// its [Lease] renews in the background while the holder lives; a holder
// that crashes without releasing frees its slot within one Lease.
type Concurrency struct {
	Limit int           // holders at once, at least 1
	Lease time.Duration // how long a slot outlives its holder's last renewal; 10 ms to 10 years, whole µs
}

// Validate reports why the policy cannot be used, as an error wrapping
// [ErrInvalidPolicy], or nil.
func (p Concurrency) Validate() error {
	if p.Limit < 1 {
		return invalidPolicy("Concurrency.Limit must be at least 1, got %d", p.Limit)
	}
	if int64(p.Limit) > maxExact {
		return invalidPolicy("Concurrency.Limit must be at most 2^50, got %d", p.Limit)
	}
	return checkSpan("Concurrency.Lease", p.Lease, 10*time.Millisecond)
}

// heartbeat is how often a held Lease is renewed: a third of the lease, so
// that two renewals may fail before the slot is lost.
func (p Concurrency) heartbeat() time.Duration { return p.Lease / 3 }

// Concurrency script modes (ARGV[1]).
const (
	modeAcquire = "0"
	modeCount   = "1"
	modeRelease = "2"
	modeRenew   = "3"
)

// ConcurrencyLimiter caps how many holders a key has at once. It is safe for
// concurrent use; create one per policy and reuse it. The zero value is not
// usable: call [NewConcurrencyLimiter].
type ConcurrencyLimiter struct {
	conn
	policy Concurrency
	id     string
	params []any // ARGV[3:5] of the script: limit, lease

	wakerOnce sync.Once
	waker     *waker // the line's wake-ups, see line.go
	// parking brings back parked waiters called back (set by the worker
	// through internal/gate); heads and hold serve it (see parking.go).
	parking atomic.Pointer[parking]
	heads   heads
	hold    atomic.Int64 // nanoseconds, an average of this process's holds
}

// NewConcurrencyLimiter returns the ConcurrencyLimiter called name that
// applies p through client: its name is its identity, as a Limiter's is
// (see [New]). It takes the same options as New, with the same defaults
// (WithLivePolicies excepted); under
// [FailOpen] an Acquire that Redis cannot answer is granted a Degraded
// lease that holds no slot.
func NewConcurrencyLimiter(client redis.UniversalClient, name string, p Concurrency, opts ...Option) (*ConcurrencyLimiter, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	c, err := newConn(client, name, opts)
	if err != nil {
		return nil, err
	}
	if c.cfg.live {
		return nil, fmt.Errorf("%w: WithLivePolicies applies to a Limiter, not to a ConcurrencyLimiter", ErrInvalidOption)
	}
	form := fmt.Sprintf("conc:%d/%s", p.Limit, p.Lease)
	c.fixed = form
	c.register(keyspace.Entry{Policy: form})
	return &ConcurrencyLimiter{
		conn:   c,
		policy: p,
		id:     name + "@conc",
		params: []any{itoa(int64(p.Limit)), itoa(p.Lease.Microseconds())},
	}, nil
}

// Policy returns the policy the limiter applies.
func (c *ConcurrencyLimiter) Policy() Concurrency { return c.policy }

// Name returns the limiter's name, as given to NewConcurrencyLimiter (see
// [New] on names). Decisions carry it as Decision.Limiter.
func (c *ConcurrencyLimiter) Name() string { return c.cfg.name }

// Key returns the Redis key holding callerKey's holders.
func (c *ConcurrencyLimiter) Key(callerKey string) string {
	return c.cfg.redisKey(c.id, callerKey)
}

// Acquire takes one of key's slots and returns its Lease, renewed in the
// background until Release. When all slots are held, or others wait for
// them in [ConcurrencyLimiter.AcquireWait], it returns a nil Lease and a
// Result with Allowed false whose RetryAfter estimates the wait: the time
// until the oldest lease runs out (a holder may release sooner, or renew).
// Release every Lease, typically with defer.
func (c *ConcurrencyLimiter) Acquire(ctx context.Context, key string) (*Lease, Result, error) {
	start := c.began()
	lease, r, err := c.acquire(ctx, key)
	c.observe(ctx, OpAcquire, key, 1, start, r, err)
	return lease, r, err
}

func (c *ConcurrencyLimiter) acquire(ctx context.Context, key string) (*Lease, Result, error) {
	if err := validRequest(key, 1, c.policy.Limit); err != nil {
		return nil, Result{}, err
	}
	holder := newHolderID()
	sent := time.Now()
	reply, err := c.run(ctx, modeAcquire, key, holder)
	if err != nil {
		if c.failOpen(ctx, err) {
			return degradedLease(), Result{Allowed: true, Limit: c.policy.Limit, Degraded: true, cause: err}, nil
		}
		return nil, Result{}, c.unavailable(ctx, err)
	}
	r := resultOf(reply, c.policy.Limit)
	if !r.Allowed {
		return nil, r, nil
	}
	return startLease(c, key, holder, sent), r, nil
}

// Peek reports how many of key's slots are free now, without taking one.
func (c *ConcurrencyLimiter) Peek(ctx context.Context, key string) (Result, error) {
	if err := validRequest(key, 1, c.policy.Limit); err != nil {
		return Result{}, err
	}
	reply, err := c.run(ctx, modeCount, key, "")
	if err != nil {
		return Result{}, c.unavailable(ctx, err)
	}
	return resultOf(reply, c.policy.Limit), nil
}

// Reset drops every holder of key, and its line of waiters. The leases
// find out at their next renewal and report [ErrLeaseLost]; waiters in
// AcquireWait stand in line again at their next look.
func (c *ConcurrencyLimiter) Reset(ctx context.Context, key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	return c.del(ctx, c.lineKeys(key)...)
}

// run runs the concurrency script for one holder of key.
func (c *ConcurrencyLimiter) run(ctx context.Context, mode, key, holder string) (reply, error) {
	args := append([]any{mode, holder}, c.params...)
	return c.eval(ctx, concurrencyScript, c.lineKeys(key), args)
}

// newHolderID returns a random identity for one lease.
func newHolderID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}
