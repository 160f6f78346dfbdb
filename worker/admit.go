package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// cannotPass reports an error of a rule's limiter that asking again will
// not mend: a task cost above what the policy can ever admit, or a policy
// (a plan) that cannot apply.
func cannotPass(err error) bool {
	return errors.Is(err, throttle.ErrExceedsLimit) || errors.Is(err, throttle.ErrInvalidPolicy) || errors.Is(err, throttle.ErrInvalidN)
}

// admit passes the task through its rules, waiting inline where it may.
// It returns the admitted pass, holding the leases to release after the
// handler; or nil and the error the handler is to return; or nil, nil when
// the task was handed over to a copy.
func (t *Throttler) admit(ctx context.Context, tk *task, rules []*Rule) (*pass, error) {
	started := time.Now()
	roles := meterRoles(rules)
	var slept time.Duration
	var waitedFor cause // the rule and key of the last inline wait
	for {
		budget := t.inlineBudget(ctx, tk, started)
		p := t.tryPass(ctx, tk, rules, roles, budget)
		if p.refused == nil {
			if p.delay > 0 {
				if err := sleep(ctx, p.delay); err != nil {
					p.giveBack(ctx)
					return nil, err
				}
				_, waitedFor = p.latest()
			}
			func() {
				defer p.onPanic(ctx) // an Observer's
				t.observeAdmitted(ctx, tk, p, slept+p.delay, waitedFor)
			}()
			return p, nil
		}
		r := p.refused
		if r.err != nil {
			t.observe(ctx, Event{Kind: Failed, TaskID: tk.id, TaskType: tk.Type(), Rule: r.rule.name, Key: r.key, Err: r.err})
			if cannotPass(r.err) {
				// Asking again would fail the same way: the task's cost
				// never fits the policy, or the policy cannot apply.
				return nil, fmt.Errorf("worker: rule %q, key %q: %w: %w", r.rule.name, r.key, r.err, asynq.SkipRetry)
			}
		}
		switch r.how {
		case comeBack:
			// The task holds its capacity: back to its start, through the
			// lane, a little ahead of it.
			return nil, t.goBack(ctx, tk, r, time.Now().Add(r.retryAfter-t.laneLead()), true)
		case enterRoom:
			return nil, t.wait(ctx, tk, r)
		case parkInLine:
			return nil, t.park(ctx, tk, r)
		}
		// Wait inline when the rule will say yes soon enough: a window that
		// turns over.
		wait := r.retryAfter
		if wait <= budget {
			if err := sleep(ctx, wait); err != nil {
				return nil, err
			}
			slept += wait
			waitedFor = cause{r.rule.name, r.key}
			continue
		}
		return nil, t.goBack(ctx, tk, r, time.Now().Add(comeBackAfter(r)), false)
	}
}

// inlineBudget is how long the task may still wait in its handler: the
// inline wait, at least twice the lead of the return lane (a task comes
// back that much ahead of its start); for a task with no retries left, all
// the time its deadline allows.
func (t *Throttler) inlineBudget(ctx context.Context, tk *task, started time.Time) time.Duration {
	budget := max(t.cfg.inlineWait, 2*t.laneLead()) - time.Since(started)
	deadline, bounded := ctx.Deadline()
	if tk.last {
		if !bounded {
			return time.Duration(1<<63 - 1)
		}
		budget = time.Until(deadline) - deadlineMargin
	} else if bounded {
		budget = min(budget, time.Until(deadline)-deadlineMargin)
	}
	return max(0, budget)
}

func (t *Throttler) observeAdmitted(ctx context.Context, tk *task, p *pass, waited time.Duration, waitedFor cause) {
	slot, _ := p.latest()
	switch {
	case p.degraded:
		t.observe(ctx, Event{Kind: Degraded, TaskID: tk.id, TaskType: tk.Type(), Delay: waited})
	case waited > 0:
		t.observe(ctx, Event{Kind: WaitedInline, TaskID: tk.id, TaskType: tk.Type(), Rule: waitedFor.rule, Key: waitedFor.key, Delay: waited, Slot: slot})
	default:
		t.observe(ctx, Event{Kind: Admitted, TaskID: tk.id, TaskType: tk.Type(), Slot: slot})
	}
}

// cause names the rule, and the task's key in it, that made a task wait.
type cause struct{ rule, key string }
