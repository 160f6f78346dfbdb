package throttle

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Lease is one held slot of a [ConcurrencyLimiter]. While it is held, a
// goroutine renews it every third of the lease; Release frees the slot
// and stops the renewals. Its methods are safe for concurrent use.
type Lease struct {
	limiter  *ConcurrencyLimiter
	key      string
	holder   string
	degraded bool
	started  time.Time // when the acquiring call was sent

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

// startLease returns a held lease and starts its renewals; sent is when
// the acquiring call was sent, so the slot is known to be held until sent
// plus the lease at least.
func startLease(c *ConcurrencyLimiter, key, holder string, sent time.Time) *Lease {
	l := &Lease{
		limiter: c,
		key:     key,
		holder:  holder,
		started: sent,
		stop:    make(chan struct{}),
		stopped: make(chan struct{}),
		lost:    make(chan struct{}),
	}
	go l.renew(c.policy.heartbeat(), c.policy.Lease, sent)
	return l
}

// Lost is closed when the lease turns out to be lost while held: a renewal
// found it gone (it ran out, or its key was reset), or no renewal has
// reached Redis for a whole lease, counted from the moment the last good
// renewal was sent (so Lost closes no later than Redis drops the slot, what
// ever the client's timeouts). The holder should stop its work: its slot may
// already belong to someone else. Lost is never closed by Release.
func (l *Lease) Lost() <-chan struct{} { return l.lost }

// Degraded reports a lease granted without Redis under [FailOpen]: it holds
// no slot.
func (l *Lease) Degraded() bool { return l.degraded }

// Release frees the slot and stops the renewals. It is idempotent: later
// calls return what the first returned without calling Redis. Releasing a
// lease that had already been lost is harmless and reported with an error
// wrapping [ErrLeaseLost]; a Redis failure is reported with
// [ErrUnavailable], and the slot then frees itself within one lease.
// Release returns once Redis has answered, or as soon as ctx ends: the
// release then goes on in the background, for up to the limiter's timeout
// (5 s without one), and Release returns ctx's error.
func (l *Lease) Release(ctx context.Context) error {
	l.releaseOnce.Do(func() {
		l.stopOnce.Do(func() { close(l.stop) })
		if l.degraded {
			return
		}
		c := l.limiter
		c.noteHold(time.Since(l.started))
		var held bool
		err := c.cleanup(ctx, func(ctx context.Context) error {
			var err error
			held, err = c.release(ctx, l.key, l.holder)
			return err
		})
		switch {
		case err != nil:
			l.releaseErr = c.unavailable(ctx, err)
		case !held:
			l.markLost()
			l.releaseErr = fmt.Errorf("%w: the lease on %q had run out before Release", ErrLeaseLost, l.key)
		}
		// A renewal in flight ends by its own deadline, a heartbeat; a
		// renewal landing after the release finds no holder and changes
		// nothing.
		select {
		case <-l.stopped:
		case <-ctx.Done():
		}
	})
	return l.releaseErr
}

// renew keeps the lease alive until Release, or until it is lost: a
// renewal finds it gone, or none has succeeded for a whole lease since the
// last good one was sent (sent, for the acquisition). Each renewal gives up
// at its own deadline, a heartbeat, whatever the client's options.
func (l *Lease) renew(every, lease time.Duration, sent time.Time) {
	defer close(l.stopped)
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	expires := sent.Add(lease) // the slot is surely held until then
	runsOut := time.NewTimer(time.Until(expires))
	defer runsOut.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-runsOut.C:
			l.markLost()
			return
		case <-ticker.C:
		}
		// A renewal gives up at the next heartbeat, or when the lease runs
		// out if that is sooner, so that the loop sees it run out in time.
		sent := time.Now()
		deadline := sent.Add(every)
		if expires.Before(deadline) {
			deadline = expires
		}
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		reply, err := l.limiter.run(ctx, modeRenew, l.key, l.holder)
		cancel()
		select {
		case <-l.stop:
			return // released meanwhile: whatever the renewal found is moot
		default:
		}
		switch {
		case err == nil && reply.v[0] == 1:
			expires = sent.Add(lease)
			runsOut.Reset(time.Until(expires))
		case err == nil:
			l.markLost() // gone from Redis: it ran out, or was reset
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
