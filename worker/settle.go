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
	if !t.cfg.settle || t.answeredWithin(settleFresh) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, settleLimit)
	defer cancel()
	backoff := 20 * time.Millisecond
	var since time.Time
	for {
		err := t.sharedPing(ctx)
		if err == nil {
			t.answered.Store(time.Now().UnixNano()) // the other tasks ending now need not ask
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

// settleFresh: a Throttler skips the PING when asynq's Redis answered one
// of its calls this recently (a PING of settle's own, or a decision of its
// rules when they decide there): it is up.
const settleFresh = 100 * time.Millisecond

// noteAnswer records that asynq's Redis answered a call of the Throttler,
// when its rules decide there.
func (t *Throttler) noteAnswer() {
	if t.sameRedis {
		t.answered.Store(time.Now().UnixNano())
	}
}

// answeredWithin reports whether asynq's Redis answered within d.
func (t *Throttler) answeredWithin(d time.Duration) bool {
	last := t.answered.Load()
	return last != 0 && time.Since(time.Unix(0, last)) < d
}

// settleLimit is asynq's lease on a task being processed (30 s in
// v0.26): once it has run out without a heartbeat reaching Redis, asynq
// no longer writes the task's outcome, so waiting longer helps nothing.
const settleLimit = 30 * time.Second

// WithSettle chooses whether a task waits, once its handler has returned
// or it was throttled, until Redis answers before its outcome goes back to
// asynq, for at most 30 s, asynq's lease on a task. It costs one PING per
// task, skipped when that Redis answered within the last 100 ms: a PING of
// the Throttler's, or its rules' answers, refusals included, when every
// rule's limiter uses the client given to New; tasks that end while a
// PING is on its way share its answer. asynq writes a task's
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
