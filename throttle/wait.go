package throttle

import (
	"context"
	"fmt"
	"time"
)

// Wait is WaitN(ctx, key, 1).
func (l *Limiter) Wait(ctx context.Context, key string) error {
	return l.WaitN(ctx, key, 1)
}

// WaitN blocks until n units for key are admitted, like
// golang.org/x/time/rate's WaitN but across every process sharing the
// Redis. When the wait needed would pass ctx's deadline it returns at once
// with an error wrapping context.DeadlineExceeded, without consuming
// anything; when ctx is cancelled it returns promptly with ctx's error.
//
// On [TokenBucket] and [GCRA] WaitN books a slot with [Limiter.Reserve]
// and sleeps until it: one call to Redis, and many waiters on one key start
// one after another at the policy's rate. On the other policies it sleeps
// for each rejection's RetryAfter and asks again, as it does with
// [WithLeasedShares]. Errors are those of
// AllowN and Reserve; under [FailOpen] an outage lets the caller through.
func (l *Limiter) WaitN(ctx context.Context, key string, n int) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("throttle: wait abandoned: %w", err)
	}
	deadline, bounded := ctx.Deadline()
	if l.spec.reservable && l.shares == nil {
		maxDelay := maxReserveDelay
		if bounded {
			maxDelay = max(0, time.Until(deadline))
		}
		res, err := l.Reserve(ctx, key, n, maxDelay)
		if err != nil {
			return err
		}
		if !res.OK {
			return fmt.Errorf("throttle: %d units for %q need %s longer than the context's deadline allows: %w",
				n, key, res.RetryAfter, context.DeadlineExceeded)
		}
		return res.Wait(ctx)
	}
	var slept time.Time // when the first sleep began; zero until then
	for {
		r, err := l.AllowN(ctx, key, n)
		if err == nil && !r.Allowed && bounded && time.Now().Add(r.RetryAfter).After(deadline) {
			err = fmt.Errorf("throttle: %d units for %q are admitted in %s, after the context's deadline: %w",
				n, key, r.RetryAfter, context.DeadlineExceeded)
		}
		if err == nil && !r.Allowed {
			if slept.IsZero() {
				slept = time.Now()
			}
			err = sleep(ctx, r.RetryAfter)
			if err == nil {
				continue
			}
		}
		if !slept.IsZero() {
			l.observeWait(ctx, key, n, slept, err)
		}
		return err
	}
}
