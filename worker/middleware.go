package worker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
)

// Headers the Throttler puts on the hand-over copy of a task (see handOver).
const (
	headerOrigin = "jobthrottle-origin" // the first task's ID
	headerTicket = "jobthrottle-ticket" // whose bookings the copy inherits
	headerCopies = "jobthrottle-copies" // how many copies came before
)

// deadlineMargin is the time a task keeps, before its deadline, to run
// after an inline wait.
const deadlineMargin = time.Second

// Middleware returns h behind the Throttler's gate: an asynq.MiddlewareFunc
// for ServeMux.Use, or to wrap the handler given to Server.Start.
//
// A task no rule matches goes straight to h. Otherwise the gate asks every
// matching rule; a task that may run within the inline wait waits in its
// handler and runs; a later one returns a *ThrottledError, which the
// functions of [Throttler.Configure] turn into a return at the right time,
// without counting a failure or using up a retry. A task with no retries
// left never returns one: it waits inline as long as its deadline allows,
// and beyond that is handed over to a copy of itself (see the package
// documentation). Concurrency leases are released however h ends, and the
// outcome goes back to asynq only once Redis answers (see [WithSettle]).
//
// On a server whose Config lacks [Throttler.Configure], asynq would count
// those throttled tasks as failed: the first time it does, the Throttler
// logs an Error naming the fix, and the Observer sees an [Unconfigured]
// event for each such task.
func (t *Throttler) Middleware(h asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, at *asynq.Task) error {
		return t.watchDelivery(ctx, at, t.process(ctx, at, h))
	})
}

// process gates one task and runs h if its rules allow it.
func (t *Throttler) process(ctx context.Context, at *asynq.Task, h asynq.Handler) error {
	rules := t.matching(ctx, at)
	tk, err := t.describe(ctx, at, rules)
	if err != nil {
		return err
	}
	if len(rules) == 0 {
		return t.outcome(ctx, tk, h.ProcessTask(ctx, at))
	}
	p, err := t.admit(ctx, tk, rules)
	if err != nil || p == nil {
		t.settle(ctx)
		return err
	}
	return t.run(ctx, tk, p, h)
}

// run runs the handler of an admitted task, with its leases watched, and
// returns what goes back to asynq. The leases are released however the
// handler ends, a panic included (asynq recovers it).
func (t *Throttler) run(ctx context.Context, tk *task, p *pass, h asynq.Handler) (err error) {
	running := ctx
	lost := func() *held { return nil }
	defer func() {
		l := lost()
		if len(p.leases) > 0 {
			// Reported before Redis frees the slot, and taken after Redis
			// gave it: a gauge kept from the events never shows more leases
			// than Redis holds. Freed however the Observer returns.
			func() {
				defer t.giveBackLeases(ctx, p)
				t.observeLeases(ctx, tk, p, LeaseReleased)
			}()
		}
		if l != nil && err != nil {
			// The handler was stopped because its slot was no longer its
			// own: the task is throttled, not failed.
			r := &refusal{rule: l.rule, key: l.key}
			err = t.goBack(ctx, tk, r, time.Now().Add(comeBackAfter(r)), false)
		}
		t.settle(ctx)
		err = t.outcome(ctx, tk, err)
	}()
	if len(p.leases) > 0 {
		running, lost = t.watchLeases(ctx, tk, p)
		t.observeLeases(ctx, tk, p, LeaseTaken)
	}
	return h.ProcessTask(running, tk.Task)
}

// outcome is what the middleware returns for a handler's err: err itself,
// but for a *ThrottledError the handler returned for a task with no
// retries left, which asynq would archive: that task is handed over to a
// copy of itself, due when the error says.
func (t *Throttler) outcome(ctx context.Context, tk *task, err error) error {
	var throttled *ThrottledError
	if !tk.last || !errors.As(err, &throttled) {
		return err
	}
	return t.handOver(ctx, tk, throttled.Rule, throttled.Key, throttled.returnAt(time.Now()))
}

// matching returns the rules that apply to the task, in order.
func (t *Throttler) matching(ctx context.Context, at *asynq.Task) []*Rule {
	var rules []*Rule
	for i := range t.rules {
		if t.rules[i].match.Match(ctx, at) {
			rules = append(rules, &t.rules[i])
		}
	}
	return rules
}

// describe gathers what the gate needs: the task's identity, whether it
// has retries left, and its key in every rule.
func (t *Throttler) describe(ctx context.Context, at *asynq.Task, rules []*Rule) (*task, error) {
	tk := &task{Task: at}
	tk.id, _ = asynq.GetTaskID(ctx)
	tk.queue, _ = asynq.GetQueueName(ctx)
	retried, ok1 := asynq.GetRetryCount(ctx)
	maxRetry, ok2 := asynq.GetMaxRetry(ctx)
	tk.last = ok1 && ok2 && retried >= maxRetry
	tk.origin = tk.id
	if tk.id != "" {
		tk.ticket = ticketID(tk.id, retried)
	}
	// Outside an asynq server (a handler called directly) a task has no ID
	// and no ticket: it books afresh each time and keeps nothing.
	if h := at.Headers(); h != nil {
		if v := h[headerOrigin]; v != "" {
			tk.origin = v
		}
		if v := h[headerTicket]; v != "" {
			tk.ticket = v
		}
		tk.copies, _ = strconv.Atoi(h[headerCopies])
	}
	for _, r := range rules {
		key, err := r.key(ctx, at)
		if err == nil && key == "" {
			err = fmt.Errorf("%w: empty key", ErrNoKey)
		}
		if err != nil {
			t.observe(ctx, Event{Kind: Failed, TaskID: tk.id, TaskType: at.Type(), Rule: r.name, Err: err})
			return nil, fmt.Errorf("worker: rule %q: %w: %w", r.name, err, asynq.SkipRetry)
		}
		cost, err := r.costOf(ctx, at)
		if err != nil {
			t.observe(ctx, Event{Kind: Failed, TaskID: tk.id, TaskType: at.Type(), Rule: r.name, Key: key, Err: err})
			return nil, fmt.Errorf("worker: rule %q: task cost: %w: %w", r.name, err, asynq.SkipRetry)
		}
		tk.keys = append(tk.keys, key)
		tk.costs = append(tk.costs, cost)
	}
	return tk, nil
}

// sleep waits for d, or until ctx is done and returns its error.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ticketID names the bookings of one attempt of a task: a task that ran and
// failed comes back with one more retry counted, and books afresh, while a
// throttled task (not a failure) comes back with the same count and finds
// its bookings.
func ticketID(taskID string, retried int) string {
	return taskID + "#" + strconv.Itoa(retried)
}
