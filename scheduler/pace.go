package scheduler

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/lead"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
)

// Planned is one task of a paced batch.
type Planned struct {
	// ID is the task's asynq ID: the batch ID, ":" and the task's index.
	ID string
	// StartAt is when the task's slots on its throttles start: it is
	// enqueued to be processed then.
	StartAt time.Time
	// Enqueued is false for a task that was already in asynq, enqueued by
	// an earlier run of the same batch.
	Enqueued bool
}

// DefaultBookAhead is how far ahead a batch may book slots unless
// [BookAhead] says otherwise.
const DefaultBookAhead = 24 * time.Hour

// BatchOption configures how a batch is enqueued, by [Pace] or by an entry.
type BatchOption interface {
	apply(*batchConfig) error
}

type batchOptionFunc func(*batchConfig) error

func (f batchOptionFunc) apply(c *batchConfig) error { return f(c) }

type batchConfig struct {
	throttler *worker.Throttler
	bookAhead time.Duration
	taskOpts  []asynq.Option
	atSlot    bool
}

// batchClock turns the Redis clock of a batch's slots into this process's:
// the offset is taken once, from the batch's first booking, so that the
// tasks' start times keep the exact spacing of their slots.
type batchClock struct {
	offset time.Duration
	set    bool
}

func (c *batchClock) local(b worker.Booking) time.Time {
	if b.Slot.IsZero() {
		return b.StartAt
	}
	if !c.set {
		c.offset, c.set = b.StartAt.Sub(b.Slot), true
	}
	return b.Slot.Add(c.offset)
}

func newBatchConfig(opts []BatchOption) (batchConfig, error) {
	c := batchConfig{bookAhead: DefaultBookAhead}
	for _, opt := range opts {
		if opt == nil {
			return c, fmt.Errorf("%w: nil option", ErrInvalidEntry)
		}
		if err := opt.apply(&c); err != nil {
			return c, err
		}
	}
	return c, nil
}

// PacedBy paces an entry's batches on th: each task books its slots on the
// rules of th that match it, and is enqueued to be processed at them.
// Default: not paced, every task enqueued to run at once.
func PacedBy(th *worker.Throttler) BatchOption {
	return batchOptionFunc(func(c *batchConfig) error {
		if th == nil {
			return fmt.Errorf("%w: nil throttler", ErrInvalidEntry)
		}
		c.throttler = th
		return nil
	})
}

// BookAhead bounds how far ahead a paced batch books. A task whose slot
// would start later stops the batch with an error; the tasks before it stay
// enqueued. Default: [DefaultBookAhead].
func BookAhead(d time.Duration) BatchOption {
	return batchOptionFunc(func(c *batchConfig) error {
		if d <= 0 {
			return fmt.Errorf("%w: BookAhead must be positive, got %s", ErrInvalidEntry, d)
		}
		c.bookAhead = d
		return nil
	})
}

// DeliverAtSlot sets each paced task's ProcessAt to its slot itself rather
// than a little earlier. asynq keeps ProcessAt in whole seconds and delivers
// due tasks once per forwarder pass, so most tasks then reach a worker after
// their slots and run on arrival: the tasks of one second whose slots have
// passed start together. The default, ProcessAt at the slot less the
// Throttler's Lead, has them arrive early and wait in the handler for their
// exact slots. Choose DeliverAtSlot when asynq's view of the plan (its
// ProcessAt) matters more than smooth starts.
func DeliverAtSlot() BatchOption {
	return batchOptionFunc(func(c *batchConfig) error {
		c.atSlot = true
		return nil
	})
}

// TaskOptions adds asynq options to every task of the batch, such as
// asynq.Queue or asynq.MaxRetry. TaskID and ProcessAt are set by the
// scheduler and override any given here. Unless asynq.Retention is given,
// asynq keeps each task for a day once it is done, so that the batch run
// again finds it and does not run it twice.
func TaskOptions(opts ...asynq.Option) BatchOption {
	return batchOptionFunc(func(c *batchConfig) error {
		c.taskOpts = append(c.taskOpts, opts...)
		return nil
	})
}

// Pace enqueues a batch of tasks so that it flows out at the rate of the
// throttles the workers check, instead of arriving at once to be throttled
// task by task. Each task gets the asynq ID batchID + ":" + its index, books
// its slots on the TokenBucket and GCRA rules of th that match it (see
// worker.Throttler.Book) and is enqueued to be due ahead of its slot by the
// time asynq takes to hand a task to a worker (1.4 s with the intervals
// Configure sets; see DeliverAtSlot): it reaches a worker running th's
// middleware ahead of its slot, finds its slots there, and starts at its
// slot, admitted on arrival.
//
// Pace is safe to run again with the same batchID and tasks, say after a
// crash: a task already enqueued keeps its slots and is not enqueued twice,
// nor is one done within the last day (see TaskOptions).
// It stops at the first error (a booking beyond BookAhead, Redis, asynq)
// and returns the tasks done so far with it.
func Pace(ctx context.Context, client *asynq.Client, th *worker.Throttler, batchID string, tasks []*asynq.Task, opts ...BatchOption) ([]Planned, error) {
	if th == nil || client == nil {
		return nil, fmt.Errorf("%w: Pace needs an asynq client and a throttler", ErrInvalidEntry)
	}
	cfg, err := newBatchConfig(opts)
	if err != nil {
		return nil, err
	}
	cfg.throttler = th
	out := make([]Planned, 0, len(tasks))
	var clock batchClock
	for i, task := range tasks {
		p, err := cfg.enqueue(ctx, client, &clock, batchID, i, task)
		if err != nil {
			return out, err
		}
		out = append(out, p)
	}
	return out, nil
}

// doneRetention is how long asynq keeps a batch's task once it is done
// (asynq.Retention), unless the batch's TaskOptions set it: a batch run
// again within it (a replica taking over a tick, Pace run again after a
// crash) finds the task by its ID and enqueues it not twice. asynq deletes
// a task without retention as soon as it succeeds, freeing its ID. Each
// kept task costs Redis its asynq record (a few hundred bytes) meanwhile.
const doneRetention = 24 * time.Hour

// withRetention returns opts with asynq.Retention(doneRetention) added
// when they set no retention.
func withRetention(opts []asynq.Option) []asynq.Option {
	for _, o := range opts {
		if o.Type() == asynq.RetentionOpt {
			return opts
		}
	}
	return append(opts, asynq.Retention(doneRetention))
}

// errBadTask reports a task of a batch that no run could enqueue: nil, or
// of no type.
var errBadTask = errors.New("a task asynq cannot take")

// taskFault wraps an error of a batch's task that running the batch again
// would meet again (see retryable).
type taskFault struct{ err error }

func (e *taskFault) Error() string { return e.err.Error() }
func (e *taskFault) Unwrap() error { return e.err }

// retryable reports whether a batch cut short by err, an error of
// enqueue, may get past it when run again: Redis or asynq failed, or the
// run was stopped; not the task (its key, its cost, a booking beyond
// BookAhead, no type).
func retryable(err error) bool {
	var fault *taskFault
	return err != nil && !errors.As(err, &fault)
}

// enqueue books (when paced) and enqueues the index-th task of a batch.
func (c *batchConfig) enqueue(ctx context.Context, client *asynq.Client, clock *batchClock, batchID string, index int, task *asynq.Task) (Planned, error) {
	if task == nil || strings.TrimSpace(task.Type()) == "" {
		return Planned{}, &taskFault{fmt.Errorf("scheduler: batch %s: task %d: %w", batchID, index, errBadTask)}
	}
	p := Planned{ID: fmt.Sprintf("%s:%09d", batchID, index), StartAt: time.Now()}
	opts := append(withRetention(append([]asynq.Option(nil), c.taskOpts...)), asynq.TaskID(p.ID))
	if c.throttler != nil {
		booking, err := c.throttler.Book(ctx, task, p.ID, c.bookAhead, c.taskOpts...)
		if err != nil {
			err = fmt.Errorf("scheduler: batch %s: booking task %d: %w", batchID, index, err)
			if !errors.Is(err, throttle.ErrUnavailable) && ctx.Err() == nil {
				err = &taskFault{err} // its key, its cost, beyond BookAhead
			}
			return p, err
		}
		p.StartAt = clock.local(booking)
		deliver := p.StartAt
		if !c.atSlot {
			deliver = deliver.Add(-lead.Of(c.throttler))
		}
		if deliver.After(time.Now()) {
			opts = append(opts, asynq.ProcessAt(deliver))
		}
	}
	_, err := client.EnqueueContext(ctx, task, opts...)
	switch {
	case errors.Is(err, asynq.ErrTaskIDConflict), errors.Is(err, asynq.ErrDuplicateTask):
		// There already, or one it duplicates (asynq.Unique) is.
		return p, nil
	case err != nil:
		return p, fmt.Errorf("scheduler: batch %s: enqueueing task %d: %w", batchID, index, err)
	}
	p.Enqueued = true
	return p, nil
}
