package worker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
)

// handOver deals with a throttled task that has no retries left and cannot
// wait inline for its turn: returning an error would make asynq archive it,
// so instead a copy of it is enqueued to run at until, and the task itself
// ends without error. The copy carries the task's payload and headers, its
// queue, no retries (like the task now), and the ticket of the task's
// bookings, which it inherits. Its ID is derived from the task's, so a
// hand-over repeated after a crash finds the copy already there instead of
// making a second.
func (t *Throttler) handOver(ctx context.Context, tk *task, r *refusal, until time.Time) error {
	headers := maps.Clone(tk.Headers())
	if headers == nil {
		headers = map[string]string{}
	}
	headers[headerOrigin] = tk.origin
	headers[headerTicket] = tk.ticket
	headers[headerCopies] = strconv.Itoa(tk.copies + 1)
	copyID := fmt.Sprintf("%s~%d", tk.origin, tk.copies+1)
	opts := []asynq.Option{asynq.TaskID(copyID), asynq.MaxRetry(0), asynq.ProcessAt(until)}
	if tk.queue != "" {
		opts = append(opts, asynq.Queue(tk.queue))
	}
	enqueueCtx, cancel := detached(ctx)
	defer cancel()
	_, err := t.enqueuer.EnqueueContext(enqueueCtx, asynq.NewTaskWithHeaders(tk.Type(), tk.Payload(), headers), opts...)
	if err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
		t.observe(Event{Kind: Failed, TaskID: tk.id, TaskType: tk.Type(), Rule: r.rule.name, Key: r.key, Err: err})
		return fmt.Errorf("worker: handing over throttled task %s: %w", tk.id, err)
	}
	t.observe(Event{Kind: Rescheduled, TaskID: tk.id, TaskType: tk.Type(), Rule: r.rule.name, Key: r.key, Delay: time.Until(until)})
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
