package worker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/throttle"
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
func (t *Throttler) Middleware(h asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, at *asynq.Task) error {
		rules := t.matching(at)
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
	})
}

// run runs the handler of an admitted task, with its leases watched, and
// returns what goes back to asynq. The leases are released however the
// handler ends, a panic included (asynq recovers it).
func (t *Throttler) run(ctx context.Context, tk *task, p *pass, h asynq.Handler) (err error) {
	running := ctx
	lost := func() *held { return nil }
	if len(p.leases) > 0 {
		t.observeLeases(tk, p, LeaseTaken)
		running, lost = t.watchLeases(ctx, tk, p)
	}
	defer func() {
		l := lost()
		if len(p.leases) > 0 {
			// Reported before Redis frees the slot, and taken after Redis
			// gave it: a gauge kept from the events never shows more leases
			// than Redis holds.
			t.observeLeases(tk, p, LeaseReleased)
			p.giveBackLeases(ctx)
		}
		if l != nil && err != nil {
			// The handler was stopped because its slot was no longer its
			// own: the task is throttled, not failed.
			err = t.sendBack(ctx, tk, &refusal{rule: l.rule, key: l.key})
		}
		t.settle(ctx)
		err = t.outcome(ctx, tk, err)
	}()
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
func (t *Throttler) matching(at *asynq.Task) []*Rule {
	var rules []*Rule
	for i := range t.rules {
		if t.rules[i].match.Match(at) {
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
		key, err := r.key(at)
		if err == nil && key == "" {
			err = fmt.Errorf("%w: empty key", ErrNoKey)
		}
		if err != nil {
			t.observe(Event{Kind: Failed, TaskID: tk.id, TaskType: at.Type(), Rule: r.name, Err: err})
			return nil, fmt.Errorf("worker: rule %q: %w: %w", r.name, err, asynq.SkipRetry)
		}
		tk.keys = append(tk.keys, key)
	}
	return tk, nil
}

// admit passes the task through its rules, waiting inline where it may.
// It returns the admitted pass, holding the leases to release after the
// handler; or nil and the error the handler is to return; or nil, nil when
// the task was handed over to a copy.
func (t *Throttler) admit(ctx context.Context, tk *task, rules []*Rule) (*pass, error) {
	started := time.Now()
	backoff := 25 * time.Millisecond
	var slept time.Duration
	var waitedFor cause // the rule and key of the last inline wait
	for {
		p := t.tryPass(ctx, tk, rules)
		if p.refused == nil {
			budget := t.inlineBudget(ctx, tk, p.delay > 0, p.reused, started)
			if p.delay > 0 && p.delay <= budget && p.presentOnly {
				// Wait for the claimed slot without holding what was taken
				// for now; take it again then.
				waitedFor = p.waitingFor()
				p.giveBack(ctx, time.Nanosecond)
				if err := sleep(ctx, p.delay); err != nil {
					p.giveBack(ctx, 0)
					return nil, err
				}
				slept += p.delay
				continue
			}
			if p.delay <= budget {
				if err := sleep(ctx, p.delay); err != nil {
					p.giveBack(ctx, 0)
					return nil, err
				}
				if p.delay > 0 {
					waitedFor = p.waitingFor()
				}
				t.observeAdmitted(tk, p, slept+p.delay, waitedFor)
				return p, nil
			}
			keepFrom := max(time.Nanosecond, p.delay-t.lead())
			if tk.ticket == "" {
				keepFrom = 0 // nothing to come back for without a ticket
			}
			p.deferToLatest(ctx, keepFrom)
		}
		r := p.refused
		if r.err != nil {
			t.observe(Event{Kind: Failed, TaskID: tk.id, TaskType: tk.Type(), Rule: r.rule.name, Key: r.key, Err: r.err})
		}
		// Wait inline when the rule will say yes soon enough: a window that
		// turns over, or a concurrency slot polled for with a backoff.
		budget := t.inlineBudget(ctx, tk, false, false, started)
		wait := r.retryAfter
		if r.rule.conc != nil && r.err == nil {
			wait, backoff = min(backoff, r.retryAfter), min(2*backoff, 250*time.Millisecond)
		}
		if !r.kept && wait <= budget {
			if err := sleep(ctx, wait); err != nil {
				return nil, err
			}
			slept += wait
			waitedFor = cause{r.rule.name, r.key}
			continue
		}
		return nil, t.sendBack(ctx, tk, r)
	}
}

// inlineBudget is how long the task may still wait in its handler: the
// inline wait, or for a task holding a booked slot, at least the lead (sent
// back, it could not return any sooner; back for its own slot, it may wait
// the lead more); for a task with no retries left, all the time its
// deadline allows.
func (t *Throttler) inlineBudget(ctx context.Context, tk *task, booked, reused bool, started time.Time) time.Duration {
	budget := t.cfg.inlineWait
	if booked && budget > 0 {
		budget = max(budget, t.lead())
	}
	if reused {
		budget += t.lead()
	}
	budget -= time.Since(started)
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

// sendBack returns a refused task to asynq: a *ThrottledError for its
// retry set, a *GaveUpError when its rule's give-up policy says so, or for
// a task with no retries left, a hand-over to a copy of itself.
func (t *Throttler) sendBack(ctx context.Context, tk *task, r *refusal) error {
	away := t.comeBackAfter(r)
	rule := r.rule
	throttles := 0
	if rule.giveUp.enabled() && r.err == nil {
		n, since, err := t.countThrottle(ctx, rule, tk.origin)
		throttles = n
		if err == nil && rule.giveUp.givesUp(n, since) {
			t.cancelKept(ctx, tk, r)
			gave := &GaveUpError{Rule: rule.name, Key: r.key, Throttles: n, ThrottledFor: since, drop: rule.giveUp.Action == GiveUpDrop}
			t.observe(Event{Kind: GaveUp, TaskID: tk.id, TaskType: tk.Type(), Rule: rule.name, Key: r.key, Throttles: n})
			return gave
		}
	}
	until := time.Now().Add(away)
	if tk.last {
		return t.handOver(ctx, tk, rule.name, r.key, until)
	}
	t.observe(Event{Kind: Rescheduled, TaskID: tk.id, TaskType: tk.Type(), Rule: rule.name, Key: r.key, Delay: away, Throttles: throttles, Err: r.err})
	return &ThrottledError{Rule: rule.name, Key: r.key, RetryAfter: away, until: until}
}

// cancelKept gives back the slots a refused task kept for its return.
func (t *Throttler) cancelKept(ctx context.Context, tk *task, r *refusal) {
	if !r.kept || tk.ticket == "" {
		return
	}
	for i, rule := range t.matching(tk.Task) {
		if rule.limiter == nil || !rule.limiter.CanReserveAhead() {
			continue
		}
		// Asked again with its ticket and no room to wait, the limiter
		// returns the standing booking (or, if there is none, books the
		// present if it can): either way, cancelling it gives it back.
		if res, err := rule.limiter.ReserveFor(ctx, tk.keys[i], throttle.Ticket{ID: tk.ticket}, 1, 0); err == nil && res.OK {
			_ = res.Cancel(ctx)
		}
	}
}

func (t *Throttler) observeAdmitted(tk *task, p *pass, waited time.Duration, waitedFor cause) {
	switch {
	case p.degraded:
		t.observe(Event{Kind: Degraded, TaskID: tk.id, TaskType: tk.Type(), Delay: waited})
	case waited > 0:
		t.observe(Event{Kind: WaitedInline, TaskID: tk.id, TaskType: tk.Type(), Rule: waitedFor.rule, Key: waitedFor.key, Delay: waited, Slot: p.slot()})
	default:
		t.observe(Event{Kind: Admitted, TaskID: tk.id, TaskType: tk.Type(), Slot: p.slot()})
	}
}

// cause names the rule, and the task's key in it, that made a task wait.
type cause struct{ rule, key string }

// waitingFor returns the cause of the pass's wait: the rule and key of its
// booking that starts last.
func (p *pass) waitingFor() cause {
	b := p.latest()
	return cause{b.rule.name, b.key}
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
