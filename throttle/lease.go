package throttle

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Lease is one held slot of a [ConcurrencyLimiter]. While it is held, a
// goroutine renews it every [Concurrency.Heartbeat]; Release frees the slot
// and stops the renewals. Its methods are safe for concurrent use.
type Lease struct {
	limiter  *ConcurrencyLimiter
	key      string
	holder   string
	degraded bool

	stop    chan struct{} // closed to stop renewing
	stopped chan struct{} // closed when the renewals have stopped
	lost    chan struct{} // closed when the lease is found lost

	stopOnce    sync.Once
	lostOnce    sync.Once
	releaseOnce sync.Once
	releaseErr  error
}

// degradedLease returns a lease granted without Redis: it holds nothing.
func degradedLease() *Lease {
	l := &Lease{degraded: true, stop: make(chan struct{}), stopped: make(chan struct{}), lost: make(chan struct{})}
	close(l.stopped)
	return l
}

// startLease returns a held lease and starts its renewals.
func startLease(c *ConcurrencyLimiter, key, holder string) *Lease {
	l := &Lease{
		limiter: c,
		key:     key,
		holder:  holder,
		stop:    make(chan struct{}),
		stopped: make(chan struct{}),
		lost:    make(chan struct{}),
	}
	go l.renew(c.policy.Heartbeat(), c.policy.Lease)
	return l
}

// Lost is closed when the lease turns out to be lost while held: a renewal
// found it gone (it ran out, or its key was reset), or Redis could not be
// reached for a whole lease period. The holder should stop its work: its
// slot may already belong to someone else.
func (l *Lease) Lost() <-chan struct{} { return l.lost }

// Degraded reports a lease granted without Redis under [FailOpen]: it holds
// no slot.
func (l *Lease) Degraded() bool { return l.degraded }

// Release frees the slot and stops the renewals. It is idempotent: later
// calls return what the first returned without calling Redis. Releasing a
// lease that had already been lost is harmless and reported with an error
// wrapping [ErrLeaseLost]; a Redis failure is reported with
// [ErrUnavailable], and the slot then frees itself within one lease.
func (l *Lease) Release(ctx context.Context) error {
	l.releaseOnce.Do(func() {
		l.stopRenewing()
		if l.degraded {
			return
		}
		reply, err := l.limiter.run(ctx, modeRelease, l.key, l.holder)
		switch {
		case err != nil:
			l.releaseErr = l.limiter.unavailable(ctx, err)
		case reply.v[0] == 0:
			l.markLost()
			l.releaseErr = fmt.Errorf("%w: the lease on %q had run out before Release", ErrLeaseLost, l.key)
		}
	})
	return l.releaseErr
}

// renew keeps the lease alive until Release, or until it is lost.
func (l *Lease) renew(every, lease time.Duration) {
	defer close(l.stopped)
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	renewed := time.Now()
	for {
		select {
		case <-l.stop:
			return
		case <-ticker.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), every)
		reply, err := l.limiter.run(ctx, modeRenew, l.key, l.holder)
		cancel()
		switch {
		case err == nil && reply.v[0] == 1:
			renewed = time.Now()
		case err == nil || time.Since(renewed) >= lease:
			// Gone from Redis, or unrenewed for a whole lease: either way
			// the slot is no longer ours.
			l.markLost()
			return
		}
	}
}

// stopRenewing stops the renewals and waits until they have stopped.
func (l *Lease) stopRenewing() {
	l.stopOnce.Do(func() { close(l.stop) })
	<-l.stopped
}

func (l *Lease) markLost() { l.lostOnce.Do(func() { close(l.lost) }) }
