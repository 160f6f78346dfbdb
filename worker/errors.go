package worker

import (
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/redisclient"
)

var (
	// ErrThrottled matches every *ThrottledError: errors.Is(err,
	// worker.ErrThrottled) tells a throttled task from a failed one.
	ErrThrottled = errors.New("worker: task throttled")

	// ErrGaveUp matches every *GaveUpError.
	ErrGaveUp = errors.New("worker: gave up on a throttled task")

	// ErrInvalidRule reports a rule or rule option that New cannot use.
	ErrInvalidRule = errors.New("worker: invalid rule")

	// ErrInvalidOption reports a bad option, or a nil client, given to New.
	ErrInvalidOption = errors.New("worker: invalid option")

	// ErrNoKey reports a task from which a rule's key function could not
	// take a key (a missing payload field or header, say). The task fails
	// without retries: its payload will not change.
	ErrNoKey = errors.New("worker: no key for task")
)

// ThrottledError is what the middleware returns for a task that must wait
// longer than it may wait inline: asynq sends the task back through its
// retry set, and the helpers of [Throttler.Configure] bring it back after
// RetryAfter without counting a failure or using up a retry.
//
// A handler may return one too, to send its task back because a limit it
// learnt of itself (a partner's 429) says so: RetryAfter then counts from
// the moment asynq asks when to retry, and is at least a second (asynq
// cannot bring a task back sooner). Behind the middleware, a task with no
// retries left that returns one is handed over to a copy of itself instead
// of being archived, as the middleware's own throttles are.
type ThrottledError struct {
	// Rule is the name of the rule that throttled the task.
	Rule string
	// Key is the rule's key for the task (a tenant, a task type).
	Key string
	// RetryAfter is how long after the decision the task is to come back.
	RetryAfter time.Duration

	// until is the instant the task is to be back in its queue, set by the
	// middleware; zero in an error a handler built.
	until time.Time
}

// minHandlerRetry is the shortest return a handler's own ThrottledError
// asks for: asynq keeps retry times in whole seconds.
const minHandlerRetry = time.Second

// returnAt is when the task is to be back in its queue: the instant the
// middleware named, or for an error a handler built, RetryAfter (at least
// minHandlerRetry) from now.
func (e *ThrottledError) returnAt(now time.Time) time.Time {
	if !e.until.IsZero() {
		return e.until
	}
	return now.Add(max(e.RetryAfter, minHandlerRetry))
}

// Error describes the throttle.
func (e *ThrottledError) Error() string {
	return fmt.Sprintf("worker: throttled by rule %q on key %q: retry in %s", e.Rule, e.Key, e.RetryAfter)
}

// Is reports whether target is ErrThrottled.
func (e *ThrottledError) Is(target error) bool { return target == ErrThrottled }

// GaveUpError is what the middleware returns for a task that a rule's
// give-up policy has stopped throttling. It wraps asynq.SkipRetry, so asynq
// archives the task with this message (or asynq.RevokeTask under
// [GiveUpDrop]).
type GaveUpError struct {
	// Rule and Key name the rule that gave up and the task's key in it.
	Rule, Key string
	// Throttles is how many times the rule throttled the task.
	Throttles int
	// ThrottledFor is how long since the rule first throttled it.
	ThrottledFor time.Duration

	drop bool
}

// Error describes why the task was given up.
func (e *GaveUpError) Error() string {
	return fmt.Sprintf("worker: gave up after rule %q throttled the task %d times over %s (key %q)",
		e.Rule, e.Throttles, e.ThrottledFor.Round(time.Millisecond), e.Key)
}

// Is reports whether target is ErrGaveUp.
func (e *GaveUpError) Is(target error) bool { return target == ErrGaveUp }

// Unwrap returns asynq.SkipRetry (archive), or asynq.RevokeTask under
// GiveUpDrop.
func (e *GaveUpError) Unwrap() error {
	if e.drop {
		return asynq.RevokeTask
	}
	return asynq.SkipRetry
}

// redisError is err from the Throttler's own client, saying what mends it
// when the client is a plain one on a node of a Redis Cluster (MOVED).
func (t *Throttler) redisError(err error) error {
	if redisclient.MovedOnPlainClient(t.client, err) {
		return fmt.Errorf("%w (the server is a node of a Redis Cluster: give worker.New a *redis.ClusterClient, redis.NewClusterClient)", err)
	}
	return err
}
