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
func Type(types ...string) Matcher { return typeMatcher(slices.Clone(types)) }

type typeMatcher []string

func (m typeMatcher) Match(_ context.Context, t *asynq.Task) bool {
	return slices.Contains(m, t.Type())
}

// Queue matches tasks from one of the asynq queues named (see QueueOf).
func Queue(queues ...string) Matcher { return queueMatcher(slices.Clone(queues)) }

type queueMatcher []string

func (m queueMatcher) Match(ctx context.Context, _ *asynq.Task) bool {
	return slices.Contains(m, QueueOf(ctx))
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

// mayOverlap reports whether a task could match both a and b: false only
// where their kinds show it cannot (Type lists with no type in common, a
// Type list none of whose types a Pattern matches, Queue lists with no
// queue in common); true for any other pair, MatchFunc's included.
func mayOverlap(a, b Matcher) bool {
	switch a := a.(type) {
	case typeMatcher:
		switch b := b.(type) {
		case typeMatcher:
			return slices.ContainsFunc(a, func(t string) bool { return slices.Contains(b, t) })
		case patternMatcher:
			return slices.ContainsFunc(a, func(t string) bool { ok, _ := path.Match(string(b), t); return ok })
		}
	case patternMatcher:
		if _, ok := b.(typeMatcher); ok {
			return mayOverlap(b, a)
		}
	case queueMatcher:
		if b, ok := b.(queueMatcher); ok {
			return slices.ContainsFunc(a, func(q string) bool { return slices.Contains(b, q) })
		}
	}
	return true
}
