package worker

import (
	"errors"
	"time"

	"github.com/hibiken/asynq"
)

// RetryDelayFunc returns an asynq.RetryDelayFunc that brings a throttled
// task back at the time its *ThrottledError names (for one a handler built,
// RetryAfter from now, at least a second) and leaves every other error to
// prev (asynq.DefaultRetryDelayFunc when nil).
//
// asynq stores a retry time in whole seconds, rounded down; the delay
// returned aims at the first whole second at or after the named time, so a
// task never returns early.
func RetryDelayFunc(prev asynq.RetryDelayFunc) asynq.RetryDelayFunc {
	if prev == nil {
		prev = asynq.DefaultRetryDelayFunc
	}
	return func(n int, err error, task *asynq.Task) time.Duration {
		var throttled *ThrottledError
		if errors.As(err, &throttled) {
			now := time.Now()
			return delayUntil(throttled.returnAt(now), now)
		}
		return prev(n, err, task)
	}
}

// IsFailureFunc returns an IsFailure function for asynq.Config that does
// not count a throttled task as failed and leaves every other error to prev
// (any non-nil error is a failure when prev is nil). It also tells the
// middleware that the server is configured: without it, the middleware
// reports throttled tasks counted as failed (see [Unconfigured]).
func IsFailureFunc(prev func(error) bool) func(error) bool {
	if prev == nil {
		prev = func(err error) bool { return err != nil }
	}
	return func(err error) bool {
		if errors.Is(err, ErrThrottled) {
			markSeen(err)
			return false
		}
		return prev(err)
	}
}

// delayUntil returns the delay that makes asynq, computing now+delay and
// keeping whole seconds, store the first whole second at or after until.
func delayUntil(until, now time.Time) time.Duration {
	target := wholeSecondAtOrAfter(until)
	// A millisecond of slack: asynq reads its clock a moment after us, and a
	// later reading can only keep the same whole second.
	return max(0, target.Sub(now)+time.Millisecond)
}
