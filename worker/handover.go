package worker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/bounded"
	"github.com/jobthrottle/jobthrottle/internal/redisclient"
)

// handOver deals with a throttled task that has no retries left and cannot
// wait inline for its turn: returning an error would make asynq archive it,
// so instead a copy of it is enqueued to run at until, and the task itself
// ends without error. The copy carries the task's payload and headers, its
// queue, no retries (like the task now), and the ticket of the task's
// bookings, which it inherits. Its ID is derived from the task's, so a
// hand-over repeated after a crash finds the copy already there instead of
// making a second.
// The copy is enqueued even when the task's context has ended (within
// bounded.CleanupLimit): the task is ending either way, and without the
// copy it would be lost. While Redis does not answer, the hand-over waits
// for it and tries again, for at most asynq's lease on the task (30 s):
// an error would make asynq archive the task.
func (t *Throttler) handOver(ctx context.Context, tk *task, rule, key string, until time.Time) error {
	headers := maps.Clone(tk.Headers())
	if headers == nil {
		headers = map[string]string{}
	}
	headers[headerOrigin] = tk.origin
	headers[headerTicket] = tk.ticket
	headers[headerCopies] = strconv.Itoa(tk.copies + 1)
	opts := []asynq.Option{asynq.TaskID(tk.copyID()), asynq.MaxRetry(0), asynq.ProcessAt(wholeSecondAtOrAfter(until))}
	if tk.queue != "" {
		opts = append(opts, asynq.Queue(tk.queue))
	}
	enqueue := func() error {
		err := bounded.Finish(ctx, bounded.CleanupLimit, func(ctx context.Context) error {
			_, err := t.enqueuer.EnqueueContext(ctx, asynq.NewTaskWithHeaders(tk.Type(), tk.Payload(), headers), opts...)
			return err
		})
		if errors.Is(err, asynq.ErrTaskIDConflict) {
			return nil // the copy is there already
		}
		return err
	}
	if err := enqueue(); err != nil {
		t.observe(ctx, Event{Kind: Failed, TaskID: tk.id, TaskType: tk.Type(), Rule: rule, Key: key, Err: err})
		// Any error now makes asynq archive the task: while Redis does
		// not answer, wait for it and try again, as settle does, for at
		// most asynq's lease on the task.
		if err := t.untilEnqueued(ctx, enqueue, err); err != nil {
			return fmt.Errorf("worker: handing over throttled task %s: %w", tk.id, err)
		}
	}
	t.observe(ctx, Event{Kind: Rescheduled, TaskID: tk.id, TaskType: tk.Type(), Rule: rule, Key: key, Delay: time.Until(until)})
	return nil
}

// OriginalTaskID returns the ID a task is known by: asynq's ID of the task
// the handler runs, or, for a copy the Throttler made to hand over a task
// that had no retries left, the ID of the task it was copied from.
func OriginalTaskID(ctx context.Context, task *asynq.Task) string {
	if origin := task.Headers()[headerOrigin]; origin != "" {
		return origin
	}
	id, _ := asynq.GetTaskID(ctx)
	return id
}

// wholeSecondAtOrAfter rounds t up to a whole second: asynq keeps a task's
// process time in whole seconds, rounded down, which would bring the copy
// back early.
func wholeSecondAtOrAfter(t time.Time) time.Time {
	whole := t.Truncate(time.Second)
	if whole.Before(t) {
		whole = whole.Add(time.Second)
	}
	return whole
}

// untilEnqueued calls enqueue, whose first try failed with err, again with
// a growing pause (20 ms to 1 s) while it fails for want of Redis, until
// it succeeds, Redis refuses it (an answer that will not change), ctx ends
// or settleLimit has passed; it returns the last error.
func (t *Throttler) untilEnqueued(ctx context.Context, enqueue func() error, err error) error {
	deadline := time.Now().Add(settleLimit)
	backoff := 20 * time.Millisecond
	for err != nil && !redisclient.Refused(err) && time.Now().Before(deadline) {
		if sleep(ctx, backoff) != nil {
			return err
		}
		backoff = min(2*backoff, time.Second)
		err = enqueue()
	}
	return err
}
