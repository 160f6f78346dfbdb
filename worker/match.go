package worker

import (
	"fmt"
	"path"
	"slices"

	"github.com/hibiken/asynq"
)

// Matcher picks the tasks a rule applies to.
type Matcher interface {
	Match(t *asynq.Task) bool
}

// MatchFunc adapts a function to a Matcher.
type MatchFunc func(t *asynq.Task) bool

// Match calls f.
func (f MatchFunc) Match(t *asynq.Task) bool { return f(t) }

// Type matches tasks whose type is one of types.
func Type(types ...string) Matcher {
	return MatchFunc(func(t *asynq.Task) bool { return slices.Contains(types, t.Type()) })
}

// Pattern matches task types against a shell pattern, as path.Match does:
// "email:*" matches "email:send" and "email:digest". New rejects a
// malformed pattern.
func Pattern(pattern string) Matcher { return patternMatcher(pattern) }

type patternMatcher string

func (p patternMatcher) Match(t *asynq.Task) bool {
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
func AnyTask() Matcher { return MatchFunc(func(*asynq.Task) bool { return true }) }
