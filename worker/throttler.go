package worker

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/gate"
	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/jobthrottle/jobthrottle/internal/lead"
	"github.com/jobthrottle/jobthrottle/internal/redisclient"
	"github.com/redis/go-redis/v9"
)

// Throttler gates asynq task handlers with fleet-wide rules. Install its
// [Throttler.Middleware] on the server's handler and call
// [Throttler.Configure] on the server's Config. A Throttler is safe for
// concurrent use by any number of servers; the zero value is not usable:
// call [New].
type Throttler struct {
	client   redis.UniversalClient
	enqueuer *asynq.Client
	rules    []Rule
	cfg      config
	// forwarder and poll are asynq's DelayedTaskCheckInterval and
	// TaskCheckInterval as Configure saw them.
	forwarder, poll atomic.Int64
	dispatch        dispatcher
	// sameRedis: every rule decides on client, asynq's Redis, so a
	// release can move a task in asynq's queues in its own call.
	sameRedis bool
	// laneInRedis: every rule decides on asynq's Redis, one server (not a
	// Cluster), so a task's start can join its queue's lane in Redis in
	// its own call (lanes.go).
	laneInRedis bool
	// answers is when client last had an answer from Redis, whoever asked
	// (settle.go).
	answers *redisclient.Answers
	// pinging is settle's PING under way, which tasks settling meanwhile
	// share (under pingMu).
	pingMu  sync.Mutex
	pinging *flight
	// limiterClient is the client every rule's limiter uses, nil when they
	// do not all share one: a task's rules are then asked in one round
	// trip (together.go). together remembers the key sets lately refused
	// that way.
	limiterClient any
	together      refusals
	// configured finds servers whose Config lacks Configure (unconfigured.go).
	configured configureCheck
}

// asynq's defaults for DelayedTaskCheckInterval and TaskCheckInterval.
const (
	asynqForwarder = 5 * time.Second
	asynqPoll      = time.Second
)

// New returns a Throttler applying rules, in order, to every task they
// match. client is the Redis the rules' limiters use; the Throttler keeps
// its give-up counters there, and enqueues there the rare hand-over copy of
// a task that has no retries left (see the package documentation).
//
// Options and their defaults:
//
//	WithInlineWait(d)   1s               longest wait inside the handler
//	WithObserver(o)     none             receives every decision
//	WithPrefix(s)       "throttle:"      start of the give-up counters' keys
//	WithLogger(l)       slog.Default()   where decisions about tasks are logged
//	WithSettle(on)      true             outcomes go to asynq once Redis answers
//
// Errors wrap ErrInvalidRule (a rule) or ErrInvalidOption (the client or
// an option).
func New(client redis.UniversalClient, rules []Rule, opts ...Option) (*Throttler, error) {
	if redisclient.IsNil(client) {
		return nil, fmt.Errorf("%w: nil redis client", ErrInvalidOption)
	}
	redisclient.FollowFailovers(client)
	if len(rules) == 0 {
		return nil, fmt.Errorf("%w: no rules", ErrInvalidRule)
	}
	names := map[string]bool{}
	for _, r := range rules {
		if err := r.validate(); err != nil {
			return nil, err
		}
		if names[r.name] {
			return nil, fmt.Errorf("%w: two rules are named %q", ErrInvalidRule, r.name)
		}
		names[r.name] = true
	}
	if err := oneFairRulePerTask(rules); err != nil {
		return nil, err
	}
	cfg := config{inlineWait: DefaultInlineWait, prefix: "throttle:", settle: true}
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("%w: nil option", ErrInvalidOption)
		}
		if err := opt.apply(&cfg); err != nil {
			return nil, err
		}
	}
	t := &Throttler{client: client, enqueuer: asynq.NewClientFromRedisClient(client), rules: rules, cfg: cfg, sameRedis: true,
		laneInRedis: true, answers: redisclient.AnswersOf(client)}
	same := true
	for i, r := range rules {
		var l any = r.limiter
		if r.conc != nil {
			l = r.conc
		}
		c := gate.ClientOf(l)
		if c != any(client) {
			t.sameRedis = false
		}
		t.laneInRedis = t.laneInRedis && oneServer(client, c)
		if i == 0 {
			t.limiterClient = c
		}
		same = same && c != nil && c == t.limiterClient
	}
	if !same {
		t.limiterClient = nil
	}
	for _, r := range rules {
		if r.conc != nil {
			gate.OnCapCall(r.conc, t.callBack, t.parkedTask)
			gate.UsedByRule(r.conc, r.name)
		} else {
			gate.UsedByRule(r.limiter, r.name)
		}
	}
	t.dispatch.self = gate.Dispatcher{ID: dispatcherID(), Lease: dispatcherLease}
	t.forwarder.Store(int64(asynqForwarder))
	t.poll.Store(int64(asynqPoll))
	return t, nil
}

// Configure sets what asynq needs so that throttled tasks travel right, in
// one call, before the server starts:
//
//   - RetryDelayFunc: a throttled task comes back at the time its
//     ThrottledError names (rounded up to the whole second asynq stores);
//     any other error goes to the function cfg had, or asynq's default.
//   - IsFailure: a throttled task is not a failure, so it neither counts in
//     asynq's failed statistics nor uses up one of its retries; any other
//     error goes to the function cfg had, or asynq's default.
//   - DelayedTaskCheckInterval: 250ms when unset (asynq's default is 5s),
//     and TaskCheckInterval: 100ms when unset (asynq's default is 1s), so
//     that rescheduled and paced tasks reach a worker close to their time
//     rather than up to 6.5 s after it. This costs an idle server about
//     35 Redis commands a second (its polls) instead of about 2; set both
//     yourself to trade that against the rate a small fleet achieves
//     (docs/worker.md measures both).
//
// Values already set are kept, and the Throttler plans returns around them.
// Call Configure in every process that books or reschedules tasks, workers
// and schedulers alike, with the workers' settings; [Throttler.NewServer]
// builds a server with it done.
//
// A server whose Config lacks these functions counts throttled tasks as
// failed, uses up their retries and brings them back on asynq's schedule
// rather than at their slots. The middleware notices the first time asynq
// records such a task: it logs one Error naming the fix, and the Observer
// sees an [Unconfigured] event for each such task.
func (t *Throttler) Configure(cfg *asynq.Config) {
	cfg.RetryDelayFunc = RetryDelayFunc(cfg.RetryDelayFunc)
	cfg.IsFailure = IsFailureFunc(cfg.IsFailure)
	if cfg.DelayedTaskCheckInterval <= 0 {
		cfg.DelayedTaskCheckInterval = defaultForwarderInterval
	}
	if cfg.TaskCheckInterval <= 0 {
		cfg.TaskCheckInterval = defaultPollInterval
	}
	t.forwarder.Store(int64(cfg.DelayedTaskCheckInterval))
	t.poll.Store(int64(cfg.TaskCheckInterval))
}

// NewServer returns an asynq server on the Throttler's Redis client (the
// one given to [New], which must be asynq's), with cfg set up by
// [Throttler.Configure]: the one call that cannot forget it. Start it with
// a handler behind [Throttler.Middleware]. Shutting the server down leaves
// the client open.
func (t *Throttler) NewServer(cfg asynq.Config) *asynq.Server {
	t.Configure(&cfg)
	return asynq.NewServerFromRedisClient(t.client, cfg)
}

// What Configure sets asynq's DelayedTaskCheckInterval and TaskCheckInterval
// to when they are unset.
const (
	defaultForwarderInterval = 250 * time.Millisecond
	defaultPollInterval      = 100 * time.Millisecond
)

// The scheduler delivers paced tasks this long before their slots.
func init() {
	lead.Of = func(throttler any) time.Duration { return throttler.(*Throttler).lead() }
}

// lead is how long before its slot a rescheduled task is sent back, so that
// a worker has it by then: a second for the whole-second retry times asynq
// stores, one pass of its forwarder, and the longest an idle worker sleeps
// between looks at its queues (1.5 × TaskCheckInterval). It is also the
// spread of asynq's delivery: how late after a given time a task may reach a
// worker.
func (t *Throttler) lead() time.Duration {
	return time.Duration(t.forwarder.Load()) + time.Second + time.Duration(t.poll.Load())*3/2
}

// Option configures a Throttler.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	inlineWait time.Duration
	observer   Observer
	prefix     string
	logger     *slog.Logger // nil: slog.Default() when logging
	settle     bool
}

// DefaultInlineWait is the longest a task waits inside its handler for its
// turn unless [WithInlineWait] says otherwise.
const DefaultInlineWait = time.Second

// WithInlineWait sets the longest a task waits for its turn inside its
// handler, holding its worker, before it goes back to asynq instead. asynq
// cannot express a return sooner than about a second, so shorter waits are
// best spent inline. A task that goes back costs Redis about one round
// trip more than one that waits, and asynq a retry: a queue that holds only
// throttled work (a queue per partner API) does better with a wait as long
// as its backlog, while in a queue shared by tenants a long wait holds
// workers that tenants with room could use. 0 sends every throttled task
// back. Default: [DefaultInlineWait].
func WithInlineWait(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d < 0 {
			return fmt.Errorf("%w: inline wait must not be negative, got %s", ErrInvalidOption, d)
		}
		c.inlineWait = d
		return nil
	})
}

// WithObserver sends every event to o. Given more than once, every
// observer receives every event, in the order given (workermetrics and a
// dashboard.Publisher, say). Default: none.
func WithObserver(o Observer) Option {
	return optionFunc(func(c *config) error {
		if o == nil {
			return fmt.Errorf("%w: nil observer", ErrInvalidOption)
		}
		if c.observer != nil {
			c.observer = observers{c.observer, o}
		} else {
			c.observer = o
		}
		return nil
	})
}

// observers sends each event to both, in order.
type observers [2]Observer

func (o observers) Observe(ctx context.Context, e Event) {
	o[0].Observe(ctx, e)
	o[1].Observe(ctx, e)
}

// WithPrefix sets the start of the Redis keys the Throttler writes (its
// give-up counters). It holds no '{' or '}', or one hash tag, as
// throttle.WithPrefix allows. Default: "throttle:".
func WithPrefix(prefix string) Option {
	return optionFunc(func(c *config) error {
		if err := keyspace.CheckPrefix(prefix); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidOption, err)
		}
		c.prefix = prefix
		return nil
	})
}

// WithLogger sets where the Throttler logs, with log/slog: the first
// throttled task asynq counted as failed for want of [Throttler.Configure],
// at Error, once; a task failed because its rules could not be decided, or
// let through degraded, at Warn; a rule's give-up, at Info; reschedules
// and inline waits, at Debug. Default: slog.Default(). nil discards.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) error {
		if l == nil {
			l = slog.New(slog.DiscardHandler)
		}
		c.logger = l
		return nil
	})
}

func (t *Throttler) observe(ctx context.Context, e Event) {
	if e.Rule != "" {
		e.Limiter = t.limiterOf(e.Rule)
	}
	t.log(e)
	if t.cfg.observer != nil {
		t.cfg.observer.Observe(ctx, e)
	}
}

// limiterOf returns the name of the limiter of the rule named rule.
func (t *Throttler) limiterOf(rule string) string {
	switch r := t.rule(rule); {
	case r == nil:
		return ""
	case r.conc != nil:
		return r.conc.Name()
	default:
		return r.limiter.Name()
	}
}

// log writes e to the logger at its level; admissions and leases are not
// logged.
func (t *Throttler) log(e Event) {
	var level slog.Level
	switch e.Kind {
	case Failed, Degraded:
		level = slog.LevelWarn
	case GaveUp:
		level = slog.LevelInfo
	case Rescheduled, WaitedInline:
		level = slog.LevelDebug
	default:
		return
	}
	logger := t.logger()
	ctx := context.Background()
	if !logger.Enabled(ctx, level) {
		return
	}
	attrs := []slog.Attr{slog.String("task_id", e.TaskID), slog.String("task_type", e.TaskType)}
	if e.Rule != "" {
		attrs = append(attrs, slog.String("rule", e.Rule), slog.String("key", e.Key))
	}
	if e.Delay > 0 {
		attrs = append(attrs, slog.Duration("delay", e.Delay))
	}
	if e.Err != nil {
		attrs = append(attrs, slog.Any("error", e.Err))
	}
	logger.LogAttrs(ctx, level, "worker: task "+e.Kind.String(), attrs...)
}

// logger returns the configured logger, or slog.Default().
func (t *Throttler) logger() *slog.Logger {
	if t.cfg.logger == nil {
		return slog.Default()
	}
	return t.cfg.logger
}

// oneServer reports whether a rule's limiter client c decides on the one
// Redis server (not a Cluster) that client, asynq's, reaches: it is client
// itself, or a client of the same address, database and user (a Sentinel
// client only as client itself: its address is not the master's).
func oneServer(client redis.UniversalClient, c any) bool {
	own, ok := client.(*redis.Client)
	if !ok {
		return false
	}
	other, ok := c.(*redis.Client)
	if !ok {
		return false
	}
	if other == own {
		return true
	}
	o, want := other.Options(), own.Options()
	return o.Addr == want.Addr && o.Addr != "FailoverClient" && o.DB == want.DB && o.Username == want.Username
}
