package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/gate"
	"github.com/jobthrottle/jobthrottle/internal/waitroom"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// Rule is one throttle on the tasks it matches: a rate limit ([Rate]) or a
// cap on how many run at once ([Concurrency]), with the key it counts each
// task under and what to do about a task throttled too often. Rule values
// are built by Rate and Concurrency and checked by [New].
type Rule struct {
	name      string
	match     Matcher
	limiter   *throttle.Limiter
	conc      *throttle.ConcurrencyLimiter
	key       KeyFunc
	cost      CostFunc // nil: 1
	giveUp    GiveUpPolicy
	bookAhead time.Duration
	fair      *fairness
	err       error
}

// Rate returns a rule that holds the tasks match picks to limiter's
// policy, one limit per key (see [KeyBy], which every rule needs).
//
// With a TokenBucket or GCRA limiter a task that cannot run within the
// inline wait books its slot for later (up to [BookAhead]) and is brought
// back to the head of its queue at it: rescheduled tasks return one by one
// at the rate. A task under several such rules, or under one with
// [FairBy], or under one whose limiter applies live policies
// (throttle.WithLivePolicies: its policy may change while tasks wait),
// waits for its turn in the waiting room of one of them instead, released
// at the policy in force (see the package documentation). With the other policies a throttled
// task returns after the limiter's RetryAfter, spread by a random jitter
// of up to that much again (at least 1 s, at most 30 s).
//
// A limiter with leased shares (throttle.WithLeasedShares) is asked before
// the task's other rules and decides mostly in this process, without a
// Redis call; it books nothing and has no waiting room, so a task it
// throttles waits inline or returns after its RetryAfter, spread as above,
// and FairBy does not apply to it. It pays where a limit is asked by many
// tasks a second and seldom binds.
func Rate(name string, match Matcher, limiter *throttle.Limiter, opts ...RuleOption) Rule {
	r := Rule{name: name, match: match, limiter: limiter, bookAhead: DefaultBookAhead}
	if limiter == nil {
		r.err = fmt.Errorf("%w: rule %q has a nil limiter", ErrInvalidRule, name)
	}
	return r.with(opts)
}

// Concurrency returns a rule that lets at most the limiter's Limit of the
// tasks match picks run at once, per key, across every server: a lease is
// taken before the handler runs and released when it returns, fails,
// panics or is cancelled. A task that finds every slot taken stands in the
// cap's line, in the order tasks came, and waits inline to be woken when a
// slot is freed for it; when its inline wait runs out it keeps its place
// and goes back to asynq, and is called back to the head of its queue as
// its turn nears (or returns after 10 s if nobody calls it).
func Concurrency(name string, match Matcher, limiter *throttle.ConcurrencyLimiter, opts ...RuleOption) Rule {
	r := Rule{name: name, match: match, conc: limiter}
	if limiter == nil {
		r.err = fmt.Errorf("%w: rule %q has a nil limiter", ErrInvalidRule, name)
	}
	return r.with(opts)
}

// Name returns the rule's name.
func (r Rule) Name() string { return r.name }

func (r Rule) with(opts []RuleOption) Rule {
	for _, opt := range opts {
		if r.err != nil {
			break
		}
		if opt == nil {
			r.err = fmt.Errorf("%w: rule %q has a nil option", ErrInvalidRule, r.name)
			break
		}
		r.err = opt.apply(&r)
	}
	return r
}

// validate reports what New cannot use in the rule.
func (r Rule) validate() error {
	switch {
	case r.err != nil:
		return r.err
	case r.name == "":
		return fmt.Errorf("%w: a rule needs a name", ErrInvalidRule)
	case r.match == nil:
		return fmt.Errorf("%w: rule %q has no matcher", ErrInvalidRule, r.name)
	case r.key == nil:
		return fmt.Errorf("%w: rule %q has no key: say what it counts with KeyBy, such as "+
			"KeyBy(ByPayloadField(\"tenant_id\")) for a limit per tenant, KeyBy(Constant(\"all\")) for one limit "+
			"over all its tasks, KeyBy(ByType()) for one per task type", ErrInvalidRule, r.name)
	case r.fair != nil && r.limiter != nil && gate.Leased(r.limiter):
		return fmt.Errorf("%w: rule %q: FairBy and Weights share a limit through a waiting room, which a limiter "+
			"with leased shares (throttle.WithLeasedShares) has not; give the rule a limiter without them", ErrInvalidRule, r.name)
	case r.fair != nil && (r.limiter == nil || !gate.Meter(r.limiter)):
		return fmt.Errorf("%w: rule %q: FairBy and Weights apply to TokenBucket and GCRA rules only", ErrInvalidRule, r.name)
	case r.cost != nil && r.conc != nil:
		return fmt.Errorf("%w: rule %q: Cost applies to rate rules; a concurrency rule counts tasks", ErrInvalidRule, r.name)
	case r.fair != nil && r.fair.by == nil:
		return fmt.Errorf("%w: rule %q: Weights without FairBy", ErrInvalidRule, r.name)
	}
	if p, ok := r.match.(patternMatcher); ok {
		return p.validate()
	}
	return nil
}

// oneFairRulePerTask refuses rules of which two share fairly (FairBy) and
// could match the same task: a task waits for its turn in one rule's
// waiting room, so only one rule can share its limit fairly between the
// task's flows. Rules whose matchers show they pick different tasks (Type
// lists with no type in common, say) may each share fairly.
func oneFairRulePerTask(rules []Rule) error {
	for i, a := range rules {
		if a.fair == nil {
			continue
		}
		for _, b := range rules[i+1:] {
			if b.fair != nil && mayOverlap(a.match, b.match) {
				return fmt.Errorf("%w: rules %q and %q both share fairly (FairBy) and may match the same task; "+
					"a task is shared fairly under one rule only: keep FairBy on one of them, "+
					"or match different task types (worker.Type) in each", ErrInvalidRule, a.name, b.name)
			}
		}
	}
	return nil
}

// RuleOption configures a Rule.
type RuleOption interface {
	apply(*Rule) error
}

type ruleOptionFunc func(*Rule) error

func (f ruleOptionFunc) apply(r *Rule) error { return f(r) }

// KeyBy sets how the rule keys a task: the rule keeps one limit per key.
// Every rule needs one; [New] refuses a rule without it, rather than pick
// a key that would silently turn "per tenant" into "overall".
func KeyBy(key KeyFunc) RuleOption {
	return ruleOptionFunc(func(r *Rule) error {
		if key == nil {
			return fmt.Errorf("%w: rule %q: nil key function", ErrInvalidRule, r.name)
		}
		r.key = key
		return nil
	})
}

// CostFunc returns how many units of a rate rule's limit a task takes: a
// partner call that counts as 10 of its quota costs 10. ctx is the
// handler's context (see Matcher). An error, or a cost below 1, fails the
// task without retries.
type CostFunc func(ctx context.Context, t *asynq.Task) (int, error)

// Cost sets how many units of the rule's limit a task takes, as AllowN
// takes n: a task waits until its units fit, and in a waiting room a
// tenant's share counts units, not tasks. A task whose cost exceeds what
// the limit can ever admit (the burst or window limit) fails without
// retries with an error wrapping throttle.ErrExceedsLimit. Rate rules only.
// Default: every task takes 1.
func Cost(cost CostFunc) RuleOption {
	return ruleOptionFunc(func(r *Rule) error {
		if cost == nil {
			return fmt.Errorf("%w: rule %q: nil cost function", ErrInvalidRule, r.name)
		}
		r.cost = cost
		return nil
	})
}

// costOf returns what the task takes of the rule's limit.
func (r *Rule) costOf(ctx context.Context, t *asynq.Task) (int, error) {
	if r.cost == nil {
		return 1, nil
	}
	n, err := r.cost(ctx, t)
	if err == nil && n < 1 {
		err = fmt.Errorf("%w: a task costs at least 1 unit, got %d", throttle.ErrInvalidN, n)
	}
	return n, err
}

// DefaultBookAhead is how far ahead a rate rule books a rescheduled task's
// slot unless [BookAhead] says otherwise.
const DefaultBookAhead = time.Hour

// BookAhead sets how far ahead a TokenBucket or GCRA rule may book a slot
// for a rescheduled task. A task whose slot would lie further out books
// nothing and returns when it could book. Default: [DefaultBookAhead].
func BookAhead(d time.Duration) RuleOption {
	return ruleOptionFunc(func(r *Rule) error {
		if d <= 0 {
			return fmt.Errorf("%w: rule %q: BookAhead must be positive, got %s", ErrInvalidRule, r.name, d)
		}
		r.bookAhead = d
		return nil
	})
}

// GiveUpAction is what happens to a task a rule gives up on.
type GiveUpAction int

const (
	// GiveUpArchive archives the task with a *GaveUpError as its last
	// error (it wraps asynq.SkipRetry). The default.
	GiveUpArchive GiveUpAction = iota
	// GiveUpDrop deletes the task without running it (asynq.RevokeTask).
	GiveUpDrop
)

// GiveUpPolicy limits how long a rule keeps throttling one task. Throttles
// are counted in Redis by task ID, since asynq keeps no counters of its own
// in a task. The zero value never gives up.
type GiveUpPolicy struct {
	// MaxThrottles is how many times the rule may send the task back to
	// asynq; the throttle after that gives up. 0 for no limit.
	MaxThrottles int
	// MaxThrottledTime gives up on a throttle that comes this long or longer
	// after the rule first throttled the task; 0 for no limit.
	MaxThrottledTime time.Duration
	// Action says what happens then. Default: GiveUpArchive.
	Action GiveUpAction
}

func (p GiveUpPolicy) enabled() bool { return p.MaxThrottles > 0 || p.MaxThrottledTime > 0 }

// GiveUp sets the rule's give-up policy. Default: never give up.
func GiveUp(p GiveUpPolicy) RuleOption {
	return ruleOptionFunc(func(r *Rule) error {
		if p.MaxThrottles < 0 || p.MaxThrottledTime < 0 || (p.Action != GiveUpArchive && p.Action != GiveUpDrop) {
			return fmt.Errorf("%w: rule %q: bad give-up policy %+v", ErrInvalidRule, r.name, p)
		}
		r.giveUp = p
		return nil
	})
}

// fairness shares a rule's limit fairly between the flows its tasks belong
// to (see FairBy).
type fairness struct {
	by     KeyFunc
	weight func(flow string) int
}

// flowOf returns the task's flow and its weight.
func (f *fairness) flowOf(ctx context.Context, t *asynq.Task) (string, int, error) {
	flow, err := f.by(ctx, t)
	if err == nil && flow == "" {
		err = fmt.Errorf("%w: empty flow", ErrNoKey)
	}
	if err != nil {
		return "", 0, err
	}
	weight := 1
	if f.weight != nil {
		weight = max(1, f.weight(flow))
	}
	return flow, weight, nil
}

// FairBy shares a TokenBucket or GCRA rule's limit fairly between the
// flows its tasks belong to, such as tenants, by start-time fair queueing:
// while several flows have tasks waiting, each gets an equal share of the
// limit (a weighted one with Weights), whatever the order and number in
// which their tasks were enqueued, and a flow's first task waits behind no
// other flow's backlog. A flow that needs less than its share leaves the
// rest to the others: the limit stays in use. The rule's key (KeyBy) still
// says what the limit counts, typically one key for all ("overall"); by
// says which flow a task is in. Tasks a FairBy rule turns away wait in its
// key's waiting room and are let out as the limit allows (see the package
// documentation). Default: a task under several TokenBucket or GCRA rules
// is shared fairly by its key in the first of them (its tenant, typically)
// with weight 1; a task under one such rule is served in the order of its
// slots.
func FairBy(by KeyFunc) RuleOption {
	return ruleOptionFunc(func(r *Rule) error {
		if by == nil {
			return fmt.Errorf("%w: rule %q: nil flow function", ErrInvalidRule, r.name)
		}
		if r.fair == nil {
			r.fair = &fairness{}
		}
		r.fair.by = by
		return nil
	})
}

// Weights gives the flows of a FairBy rule their weights: a flow of weight
// 2 gets twice the share of a flow of weight 1. weight is called with a
// flow when one of its tasks starts waiting; a result below 1 counts as 1.
// Default: every flow weighs 1.
func Weights(weight func(flow string) int) RuleOption {
	return ruleOptionFunc(func(r *Rule) error {
		if weight == nil {
			return fmt.Errorf("%w: rule %q: nil weight function", ErrInvalidRule, r.name)
		}
		if r.fair == nil {
			r.fair = &fairness{}
		}
		r.fair.weight = weight
		return nil
	})
}

// interval is the time between two units of the rule's meter, for the
// estimates of waiting times; 0 for other rules.
func (r *Rule) interval() time.Duration { return waitroom.Interval(r.limiter.Policy()) }
