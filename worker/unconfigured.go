package worker

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/hibiken/asynq"
)

// How the middleware finds a server that lacks Configure.
//
// A task sent back with a *ThrottledError goes to asynq wrapped in a
// *delivered. asynq's processor hands the handler's error to
// handleFailedMessage, which (when the task has retries left, and the
// error is neither SkipRetry nor RevokeTask) calls Config.IsFailure with it;
// the IsFailure of Configure (IsFailureFunc) marks the delivered error as
// seen. Only then does the processor return and cancel the handler's
// context. So when that context ends and the error is still unseen, the
// server's IsFailure is not ours.
//
// The context may also end otherwise first: the task's deadline, a
// cancellation through the Inspector or the server's BaseContext, asynq's
// shutdown timeout, or a lease lost with Redis. asynq then hands on an
// error of its own, or none, and an unseen error proves nothing. So an
// unseen error is only a suspicion, settled by asynq's record of the task:
// asynq counted our error as a failure exactly when the task's retry count
// went up by one with our error's message as its last error. A server with
// Configure never records that (its IsFailure says a throttled task is not
// a failure), whatever the timing; a server without it always does, unless
// Redis failed to record the retry or the record changed again before it
// was read, and then the next throttled task tells.

// delivered is the error the middleware returns for a throttled task in an
// asynq server: the *ThrottledError (or an error wrapping one), and whether
// the IsFailure of Configure has seen it.
type delivered struct {
	error
	seen atomic.Bool
}

// Unwrap returns the error the middleware was returning.
func (d *delivered) Unwrap() error { return d.error }

// markSeen records that a function of Configure saw err.
func markSeen(err error) {
	var d *delivered
	if errors.As(err, &d) {
		d.seen.Store(true)
	}
}

// configureCheck is what a Throttler keeps to tell whether the servers it
// runs on were configured.
type configureCheck struct {
	inspectorOnce sync.Once
	inspector     *asynq.Inspector
	logged        atomic.Bool
}

// watchDelivery returns err as the middleware gives it to asynq: a
// *ThrottledError returned in an asynq server is wrapped in a *delivered,
// and checked once the handler's context ends (see above). Other errors, and
// tasks run outside an asynq server, are returned as they are.
func (t *Throttler) watchDelivery(ctx context.Context, at *asynq.Task, err error) error {
	var throttled *ThrottledError
	var already *delivered
	if !errors.As(err, &throttled) || errors.As(err, &already) {
		return err
	}
	id, ok1 := asynq.GetTaskID(ctx)
	queue, ok2 := asynq.GetQueueName(ctx)
	retried, ok3 := asynq.GetRetryCount(ctx)
	if !ok1 || !ok2 || !ok3 {
		return err
	}
	d := &delivered{error: err}
	context.AfterFunc(ctx, func() {
		if !d.seen.Load() {
			t.confirmUnconfigured(queue, id, at.Type(), retried, throttled, d.Error())
		}
	})
	return d
}

// confirmUnconfigured reads asynq's record of a task whose throttled error
// IsFailure did not see, and reports the server as unconfigured if asynq
// counted that error as a failure.
func (t *Throttler) confirmUnconfigured(queue, id, taskType string, retried int, throttled *ThrottledError, message string) {
	c := &t.configured
	c.inspectorOnce.Do(func() { c.inspector = asynq.NewInspectorFromRedisClient(t.client) })
	info, err := c.inspector.GetTaskInfo(queue, id)
	if err != nil || info.Retried != retried+1 || info.LastErr != message {
		return
	}
	if c.logged.CompareAndSwap(false, true) {
		t.logger().LogAttrs(context.Background(), slog.LevelError,
			"worker: asynq counted a throttled task as failed: call th.Configure(&cfg) before asynq.NewServer (or build the server with th.NewServer)",
			slog.String("task_id", id), slog.String("task_type", taskType), slog.String("queue", queue),
			slog.String("rule", throttled.Rule))
	}
	t.observe(context.Background(), Event{Kind: Unconfigured, TaskID: id, TaskType: taskType, Rule: throttled.Rule, Key: throttled.Key})
}
