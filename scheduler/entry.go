package scheduler

import (
	"context"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/bounded"
	"github.com/robfig/cron/v3"
)

// Producer makes the batch of tasks of one tick. Build one with [Batch] or
// [Stream].
type Producer interface {
	produce(ctx context.Context, emit func(*asynq.Task) error) error
}

// Batch is a Producer that returns its tasks all at once.
func Batch(f func(ctx context.Context) ([]*asynq.Task, error)) Producer {
	if f == nil {
		return nil
	}
	return batchProducer(f)
}

type batchProducer func(ctx context.Context) ([]*asynq.Task, error)

func (f batchProducer) produce(ctx context.Context, emit func(*asynq.Task) error) error {
	tasks, err := f(ctx)
	if err != nil {
		return err
	}
	for _, t := range tasks {
		if err := emit(t); err != nil {
			return err
		}
	}
	return nil
}

// Stream is a Producer for large batches: f hands its tasks to emit one by
// one, in a stable order (a task's ID is its position), and each is booked
// and enqueued before emit returns. An error from emit stops the batch: f
// should return it.
func Stream(f func(ctx context.Context, emit func(*asynq.Task) error) error) Producer {
	if f == nil {
		return nil
	}
	return streamProducer(f)
}

type streamProducer func(ctx context.Context, emit func(*asynq.Task) error) error

func (f streamProducer) produce(ctx context.Context, emit func(*asynq.Task) error) error {
	return f(ctx, emit)
}

// entry is one registered schedule.
type entry struct {
	name     string
	schedule cron.Schedule
	producer Producer
	batch    batchConfig
}

// run fires the entry's ticks until ctx ends. Each tick is fired in its own
// goroutine, so a long batch does not delay the next tick.
func (s *Scheduler) run(ctx context.Context, e *entry) {
	next := e.schedule.Next(s.clock.Now())
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.clock.At(next):
		}
		tick := next
		next = e.schedule.Next(tick)
		s.running.Add(1)
		go func() {
			defer s.running.Done()
			s.fire(ctx, e, tick)
		}()
	}
}

// fire runs one tick if this replica wins its claim. A claim Redis fails
// is asked again every recoverEvery until the entry's next tick comes (and
// for no longer than a lapsed tick would be taken over, recoverWithin), so
// that a tick that came while Redis was away is produced once it is back,
// unless a later one has come since; the first failure is reported.
func (s *Scheduler) fire(ctx context.Context, e *entry, tick time.Time) {
	for reported := false; ; {
		won, err := s.claim(ctx, s.claimsOf(e.name), claimTake, tick.UnixMicro(), claimLease)
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			if won == 1 {
				s.produceClaimed(ctx, e, tick)
			}
			return
		case !reported:
			s.report(&EntryError{Entry: e.name, Tick: tick, Err: fmt.Errorf("claiming the tick (asked again every %s): %w", recoverEvery, err)})
			reported = true
		}
		again := s.clock.Now().Add(recoverEvery)
		if again.Sub(tick) > recoverWithin || !e.schedule.Next(tick).After(s.clock.Now()) {
			return // the next tick is the entry's now
		}
		select {
		case <-ctx.Done():
			return
		case <-s.clock.At(again):
		}
	}
}

// produceClaimed produces the batch of a tick this replica has claimed,
// renewing the claim meanwhile. A batch done to its end, or stopped by its
// producer's own failure, is marked done, even when the scheduler is
// stopping meanwhile. One cut short (its producer stopped by the stop, or
// tasks that could not be booked or enqueued) is released, and another
// replica, or this one, takes it over and produces it again: its task IDs
// make that run enqueue only what is missing.
func (s *Scheduler) produceClaimed(ctx context.Context, e *entry, tick time.Time) {
	c := s.claimsOf(e.name)
	done, renewing := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(renewing)
		s.keepClaim(c, tick.UnixMicro(), done)
	}()
	unfinished, err := s.produce(ctx, e, tick)
	close(done)
	// No renewal in flight may land after the release below (it would hold
	// the tick 6 s more) or after Stop returns.
	<-renewing
	if err != nil {
		s.report(&EntryError{Entry: e.name, Tick: tick, Err: err})
	}
	if unfinished || (err != nil && ctx.Err() != nil) {
		// (A batch enqueued whole as the stop came is done: released, it
		// would be produced again by another replica.)
		s.release(ctx, c, tick.UnixMicro())
		return
	}
	err = bounded.Finish(ctx, claimRenewal, func(ctx context.Context) error {
		_, err := s.claim(ctx, c, claimFinish, tick.UnixMicro(), doneKeep(e.schedule, tick))
		return err
	})
	if err != nil {
		// The claim lapses unfinished, and another look produces the tick
		// again: its tasks' IDs keep that from enqueueing them twice.
		s.report(&EntryError{Entry: e.name, Tick: tick, Err: fmt.Errorf("marking the tick done: %w", err)})
	}
}

// produce runs the producer, a panic turned into an error, and enqueues
// what it emits. unfinished reports a batch cut short by a failure to book
// or enqueue a task, which another run may get past.
func (s *Scheduler) produce(ctx context.Context, e *entry, tick time.Time) (unfinished bool, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: %v\n%s", ErrProducerPanicked, p, debug.Stack())
		}
	}()
	id := batchID(e.name, tick)
	index := 0
	var clock batchClock
	err = e.producer.produce(context.WithValue(ctx, tickKey{}, tick), func(task *asynq.Task) error {
		_, err := e.batch.enqueue(ctx, s.enqueue, &clock, id, index, task)
		index++
		if retryable(err) {
			unfinished = true
		}
		return err
	})
	return unfinished, err
}
