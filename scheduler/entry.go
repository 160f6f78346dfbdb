package scheduler

import (
	"context"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/hibiken/asynq"
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
	next := e.schedule.Next(time.Now())
	for {
		timer := time.NewTimer(time.Until(next))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
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

// fire runs one tick if this replica wins its claim.
func (s *Scheduler) fire(ctx context.Context, e *entry, tick time.Time) {
	key := s.claimKey(e.name, tick)
	won, err := s.claim(ctx, key, claimTake, claimLease)
	if err != nil {
		s.report(&EntryError{Entry: e.name, Tick: tick, Err: fmt.Errorf("claiming the tick: %w", err)})
		return
	}
	if !won {
		return // another replica has it
	}
	done := make(chan struct{})
	go s.keepClaim(key, done)
	err = s.produce(ctx, e, tick)
	close(done)
	if err != nil {
		s.report(&EntryError{Entry: e.name, Tick: tick, Err: err})
	}
	finish, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_, _ = s.claim(finish, key, claimFinish, claimDone)
}

// produce runs the producer, a panic turned into an error, and enqueues
// what it emits.
func (s *Scheduler) produce(ctx context.Context, e *entry, tick time.Time) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: %v\n%s", ErrProducerPanicked, p, debug.Stack())
		}
	}()
	batchID := e.name + "@" + tick.UTC().Format(time.RFC3339Nano)
	index := 0
	var clock batchClock
	return e.producer.produce(ctx, func(task *asynq.Task) error {
		_, err := e.batch.enqueue(ctx, s.enqueue, &clock, batchID, index, task)
		index++
		return err
	})
}
