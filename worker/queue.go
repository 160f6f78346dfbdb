package worker

import (
	"context"

	"github.com/hibiken/asynq"
)

// DefaultQueue is asynq's queue for tasks enqueued without asynq.Queue.
const DefaultQueue = "default"

// queueKey carries the queue Book was told a task goes to.
type queueKey struct{}

// QueueOf returns the asynq queue of the task a rule is deciding on: in a
// handler, the queue asynq took it from; in Throttler.Book, the queue of
// the asynq.Queue option Book was given, or [DefaultQueue].
func QueueOf(ctx context.Context) string {
	if q, ok := asynq.GetQueueName(ctx); ok {
		return q
	}
	if q, ok := ctx.Value(queueKey{}).(string); ok {
		return q
	}
	return DefaultQueue
}

// withQueueOf returns ctx carrying the queue named by an asynq.Queue option
// among opts, if any.
func withQueueOf(ctx context.Context, opts []asynq.Option) context.Context {
	for _, opt := range opts {
		if opt != nil && opt.Type() == asynq.QueueOpt {
			if q, ok := opt.Value().(string); ok {
				return context.WithValue(ctx, queueKey{}, q)
			}
		}
	}
	return ctx
}
