package worker

import (
	"context"
	"log/slog"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/bounded"
)

// settle waits, before a task's outcome goes back to asynq, until Redis
// answers, so that asynq can record it. asynq writes a task's outcome
// (done, retry, archive) to Redis once, when the handler returns; when
// Redis is down at that moment the write is lost (asynq v0.26 retries it
// with a context already cancelled), the task stays active until its lease
// runs out, and asynq's recoverer then counts a failure: a task that ran
// runs again, and one with no retries left is archived. Waiting for Redis
// here closes that gap to the time between the answer and asynq's write.
// It gives up when ctx ends, or after settleLimit.
func (t *Throttler) settle(ctx context.Context) {
	if !t.cfg.settle || t.answers.Within(settleFresh) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, settleLimit)
	defer cancel()
	backoff := 20 * time.Millisecond
	var since time.Time
	for {
		err := t.sharedPing(ctx)
		if err == nil {
			if !since.IsZero() {
				t.logger().LogAttrs(ctx, slog.LevelInfo, "worker: redis answers again; handing the task's outcome to asynq",
					slog.Duration("waited", time.Since(since)))
			}
			return
		}
		if ctx.Err() != nil {
			return
		}
		if since.IsZero() {
			since = time.Now()
			t.logger().LogAttrs(ctx, slog.LevelWarn, "worker: redis does not answer; the task waits for it before asynq records its outcome",
				slog.Any("error", err))
		}
		if sleep(ctx, backoff) != nil {
			return
		}
		backoff = min(2*backoff, time.Second)
	}
}

// flight is one PING, shared by the tasks that settle while it is on its
// way: a process ending many tasks at once sends one.
type flight struct {
	done chan struct{}
	err  error
}

// sharedPing PINGs asynq's Redis, or waits for the PING already on its
// way and returns its answer.
func (t *Throttler) sharedPing(ctx context.Context) error {
	t.pingMu.Lock()
	if f := t.pinging; f != nil {
		t.pingMu.Unlock()
		select {
		case <-f.done:
			return f.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	f := &flight{done: make(chan struct{})}
	t.pinging = f
	t.pingMu.Unlock()
	f.err = bounded.Call(ctx, func(ctx context.Context) error { return t.client.Ping(ctx).Err() })
	t.pingMu.Lock()
	t.pinging = nil
	t.pingMu.Unlock()
	close(f.done)
	return f.err
}

// settleFresh: a Throttler skips the PING when the client given to New
// had an answer from Redis this recently, whoever asked (asynq's polls
// and writes, the rules' decisions when their limiters use that client, a
// PING of settle's own): it is up.
const settleFresh = 100 * time.Millisecond

// settleLimit is asynq's lease on a task being processed (30 s in
// v0.26): once it has run out without a heartbeat reaching Redis, asynq
// no longer writes the task's outcome, so waiting longer helps nothing.
const settleLimit = 30 * time.Second

// WithSettle chooses whether a task waits, once its handler has returned
// or it was throttled, until Redis answers before its outcome goes back to
// asynq, for at most 30 s, asynq's lease on a task. It costs one PING per
// task, skipped when the client given to New had an answer from Redis
// within the last 100 ms, whoever asked: asynq's own polls and writes
// when asynq uses that client, as it should, its rules' decisions when
// their limiters use it, a PING of the Throttler's. Tasks that end while
// a PING is on its way share its answer. asynq writes a task's
// outcome once, when the handler returns; without this, a task that ends
// while Redis is down stays active until its lease runs out and then runs
// again, or is archived if it had no retries left. The client given to
// [New] must be asynq's Redis.
// Default: true.
func WithSettle(on bool) Option {
	return optionFunc(func(c *config) error {
		c.settle = on
		return nil
	})
}
