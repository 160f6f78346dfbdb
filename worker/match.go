package worker

import (
	"context"
	"fmt"
	"path"
	"slices"

	"github.com/hibiken/asynq"
)

// Matcher picks the tasks a rule applies to. ctx is the handler's context,
// in which asynq puts the task's queue, ID and retry count (QueueOf and
// asynq's GetQueueName, GetTaskID...), and whatever earlier middleware
// added; for Throttler.Book, the context Book was given.
type Matcher interface {
	Match(ctx context.Context, t *asynq.Task) bool
}

// MatchFunc adapts a function to a Matcher.
type MatchFunc func(ctx context.Context, t *asynq.Task) bool

// Match calls f.
func (f MatchFunc) Match(ctx context.Context, t *asynq.Task) bool { return f(ctx, t) }

// Type matches tasks whose type is one of types.
func Type(types ...string) Matcher {
	return MatchFunc(func(_ context.Context, t *asynq.Task) bool { return slices.Contains(types, t.Type()) })
}

// Queue matches tasks from one of the asynq queues named (see QueueOf).
func Queue(queues ...string) Matcher {
	return MatchFunc(func(ctx context.Context, _ *asynq.Task) bool { return slices.Contains(queues, QueueOf(ctx)) })
}

// Pattern matches task types against a shell pattern, as path.Match does:
// "email:*" matches "email:send" and "email:digest". New rejects a
// malformed pattern.
func Pattern(pattern string) Matcher { return patternMatcher(pattern) }

type patternMatcher string

func (p patternMatcher) Match(_ context.Context, t *asynq.Task) bool {
	ok, _ := path.Match(string(p), t.Type())
	return ok
}

func (p patternMatcher) validate() error {
	if _, err := path.Match(string(p), ""); err != nil {
		return fmt.Errorf("%w: pattern %q: %w", ErrInvalidRule, string(p), err)
	}
	return nil
}

// AnyTask matches every task.
func AnyTask() Matcher { return MatchFunc(func(context.Context, *asynq.Task) bool { return true }) }
