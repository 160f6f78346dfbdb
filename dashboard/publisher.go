package dashboard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jobthrottle/jobthrottle/dashboard/internal/fleet"
	"github.com/jobthrottle/jobthrottle/internal/bounded"
	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/jobthrottle/jobthrottle/internal/redisclient"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
	"github.com/redis/go-redis/v9"
)

// ErrInvalidOption reports a nil client or an option out of range, given
// to New or NewPublisher.
var ErrInvalidOption = errors.New("dashboard: invalid option")

// Bounds of what a Publisher holds between two flushes.
const (
	// maxLimiters is the most limiters a Publisher counts between two
	// flushes; decisions of further limiters are dropped, and logged.
	maxLimiters = 200
	// maxHeldSeconds bounds the per-key seconds kept through failed
	// flushes (about 40 MB); beyond it, keys' seconds are dropped and only
	// the limiters' totals kept.
	maxHeldSeconds = 1 << 20
	// warnEvery is the least time between two warnings of failed flushes.
	warnEvery = time.Minute
)

// Publisher adds up the decisions of this process's limiters and worker in
// memory and writes them to Redis every few seconds, in aggregate (one
// pipeline per flush, never a write per decision), for the dashboard to
// show the whole fleet's counts. Give it to every limiter with
// throttle.WithObserver and to the worker with worker.WithObserver, and
// Close it when the process ends.
//
// Counts are per second of the Redis server's clock and per caller key, up
// to a bound of keys per limiter (WithKeysPerLimiter) and 200 limiters
// between two flushes. A decision counts once, whatever its N. A flush that
// fails keeps its counts for the next one, for up to 15 minutes. Every key
// it writes expires (see the package documentation). A Publisher is safe
// for concurrent use. The zero value is not usable: call NewPublisher.
type Publisher struct {
	client   redis.UniversalClient
	cfg      publisherConfig
	now      func() time.Time // the local clock; a test's Redis clock
	offset   atomic.Int64     // Redis clock minus now, in nanoseconds
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
	flushMu  sync.Mutex // one flush at a time

	mu      sync.Mutex
	live    map[string]*fleet.LimiterBatch
	dropped int64 // decisions of limiters beyond maxLimiters
	closed  bool
	warned  time.Time // the last warning of a failed flush
	failed  int       // failed flushes since that warning
	sent    int       // commands of the last flush, for tests and benchmarks

	flushes atomic.Int64 // flushes that succeeded, for tests
}

var (
	_ throttle.Observer = (*Publisher)(nil)
	_ worker.Observer   = (*Publisher)(nil)
)

// NewPublisher returns a Publisher writing to client, flushing in a
// goroutine of its own until Close. Its options and their defaults:
//
//	WithPublishPrefix(p)      "throttle:"      the limiters' key prefix
//	WithFlushInterval(d)      2s               time between two flushes
//	WithKeysPerLimiter(n)     1000             caller keys counted per limiter
//	WithPublisherLogger(l)    slog.Default()   where failed flushes are logged
//	WithProcessName(s)        hostname:pid     this process in the dashboard
//
// A nil client or an option out of range fails with an error wrapping
// ErrInvalidOption.
func NewPublisher(client redis.UniversalClient, opts ...PublisherOption) (*Publisher, error) {
	return newPublisher(client, time.Now, opts...)
}

func newPublisher(client redis.UniversalClient, now func() time.Time, opts ...PublisherOption) (*Publisher, error) {
	if redisclient.IsNil(client) {
		return nil, fmt.Errorf("%w: nil redis client", ErrInvalidOption)
	}
	redisclient.FollowFailovers(client)
	host, _ := os.Hostname()
	cfg := publisherConfig{
		prefix:   throttle.DefaultPrefix,
		interval: 2 * time.Second,
		keys:     1000,
		logger:   slog.Default(),
		process:  host + ":" + strconv.Itoa(os.Getpid()),
	}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil option", ErrInvalidOption)
		}
		if err := o.apply(&cfg); err != nil {
			return nil, err
		}
	}
	p := &Publisher{
		client: client, cfg: cfg, now: now,
		stop: make(chan struct{}), done: make(chan struct{}),
		live: map[string]*fleet.LimiterBatch{},
	}
	go p.run()
	return p, nil
}

// ObserveDecision counts one decision of a limiter (throttle.Observer):
// admitted (Degraded included) or throttled. Peeks, waits and errors are
// not counted. It also notes the limiter's kind, its policy in code, and a
// key's policy when a plan or a stored policy chose it.
func (p *Publisher) ObserveDecision(_ context.Context, d throttle.Decision) {
	if d.Op == throttle.OpPeek || d.Op == throttle.OpWait || d.Op == throttle.OpShare || d.Outcome == throttle.Errored {
		return
	}
	var c fleet.Counts
	if d.Outcome == throttle.Throttled {
		c.Throttled = 1
	} else {
		c.Admitted = 1
	}
	kind := "rate"
	if d.Op == throttle.OpAcquire || strings.HasPrefix(d.Limiter, "conc:") || strings.HasPrefix(d.Policy, "conc:") {
		kind = "concurrency"
	}
	p.count(d.Limiter, d.Key, kind, d.Policy, d.PolicySource, c)
}

// Observe counts a task the worker rescheduled (worker.Observer), under its
// rule's limiter and key. Other events, and events naming no limiter, are
// not counted.
func (p *Publisher) Observe(_ context.Context, e worker.Event) {
	if e.Kind != worker.Rescheduled || e.Limiter == "" {
		return
	}
	p.count(e.Limiter, e.Key, "", "", "", fleet.Counts{Rescheduled: 1})
}

// count adds c at this second of the Redis clock.
func (p *Publisher) count(limiter, key, kind, policy string, source throttle.PolicySource, c fleet.Counts) {
	unix := p.now().Add(time.Duration(p.offset.Load())).Unix()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	l := p.live[limiter]
	if l == nil {
		if len(p.live) >= maxLimiters {
			p.dropped++
			return
		}
		l = &fleet.LimiterBatch{Callers: map[string]*fleet.Caller{}}
		p.live[limiter] = l
	}
	if kind != "" && l.Kind != "concurrency" {
		l.Kind = kind
	}
	if source == throttle.SourceCode && policy != "" && l.CodePolicy != policy {
		l.CodePolicy = policy
	}
	l.Seconds = fleet.Add(l.Seconds, unix, c)
	caller := l.Callers[key]
	if caller == nil {
		if len(l.Callers) >= p.cfg.keys {
			return // counted in the limiter's totals only
		}
		caller = &fleet.Caller{}
		l.Callers[key] = caller
	}
	caller.Seconds = fleet.Add(caller.Seconds, unix, c)
	if source != "" && source != throttle.SourceCode && (caller.Policy != policy || caller.Source != string(source)) {
		caller.Policy, caller.Source = policy, string(source)
	}
}

// Close stops the flushing and flushes what is left. It returns ctx's error
// if ctx ends first, or the last flush's error. Decisions observed after
// Close are not counted. Calling it again flushes what a failed flush left.
func (p *Publisher) Close(ctx context.Context) error {
	p.stopOnce.Do(func() { close(p.stop) })
	select {
	case <-p.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	// Close returns when ctx ends whatever the client's options; the last
	// flush then goes on in the background until the client gives up. It
	// is not cut short: a pipeline abandoned after Redis applied it would
	// be counted again.
	return bounded.Call(ctx, func(context.Context) error { return p.flush(ctx) })
}

func (p *Publisher) run() {
	defer close(p.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-p.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	_, _ = p.measure(ctx) // the first interval's seconds on the Redis clock too
	tick := time.NewTicker(p.cfg.interval)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-tick.C:
			// A flush that times out after Redis applied it is written
			// again with the next: give it time rather than count twice.
			flushCtx, cancelFlush := context.WithTimeout(ctx, max(p.cfg.interval, flushTimeout))
			_ = p.flush(flushCtx)
			cancelFlush()
		}
	}
}

// measure reads the Redis clock and notes its offset from the local one,
// against the middle of the round trip.
func (p *Publisher) measure(ctx context.Context) (time.Time, error) {
	sent := p.now()
	var server time.Time
	err := bounded.Call(ctx, func(ctx context.Context) error {
		var err error
		server, err = fleet.Now(ctx, p.client)
		return err
	})
	if err != nil {
		return time.Time{}, err
	}
	took := p.now().Sub(sent)
	p.offset.Store(int64(server.Sub(sent.Add(took / 2))))
	return server, nil
}

// flush writes the counts since the last successful flush. On failure it
// keeps them for the next flush, the last 15 minutes of them.
func (p *Publisher) flush(ctx context.Context) error {
	p.flushMu.Lock()
	defer p.flushMu.Unlock()
	p.mu.Lock()
	batch, dropped := p.live, p.dropped
	p.live, p.dropped = map[string]*fleet.LimiterBatch{}, 0
	p.mu.Unlock()

	now, err := p.measure(ctx)
	if err == nil {
		fleet.Trim(batch, now.Add(-fleet.Window).Unix())
		p.sent, err = fleet.Flush(ctx, p.client, p.cfg.prefix, &fleet.Batch{Process: p.cfg.process, Limiters: batch}, now)
	}
	if dropped > 0 {
		p.cfg.logger.Warn("dashboard: too many limiters: decisions of further limiters were not counted",
			slog.Int("limiters", maxLimiters), slog.Int64("decisions", dropped))
	}
	if err == nil {
		p.flushes.Add(1)
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// the failed batch is the older: merge it under the live counts, then
	// drop what the dashboard would no longer show
	fleet.Merge(p.live, batch, fleet.Bounds{Limiters: maxLimiters, KeysPerLimiter: p.cfg.keys, KeySeconds: maxHeldSeconds})
	fleet.Trim(p.live, p.now().Add(time.Duration(p.offset.Load())-fleet.Window).Unix())
	p.failed++
	if local := p.now(); local.Sub(p.warned) >= warnEvery {
		p.cfg.logger.Warn("dashboard: publishing counts to Redis failed; they are kept for the next flush, 15 minutes at most",
			slog.Int("failures", p.failed), slog.Any("error", err))
		p.warned, p.failed = local, 0
	}
	return err
}

// PublisherOption configures a Publisher; see NewPublisher.
type PublisherOption interface {
	apply(*publisherConfig) error
}

type publisherOptionFunc func(*publisherConfig) error

func (f publisherOptionFunc) apply(c *publisherConfig) error { return f(c) }

type publisherConfig struct {
	prefix   string
	interval time.Duration
	keys     int
	logger   *slog.Logger
	process  string
}

// minFlushInterval is the shortest flush interval a Publisher accepts.
const (
	minFlushInterval = 100 * time.Millisecond
	// maxFlushInterval keeps a process in the dashboard's fleet (it
	// counts those seen within a minute) and its counts in the charts.
	maxFlushInterval = 30 * time.Second
	// flushTimeout is the least time a flush is given.
	flushTimeout = 10 * time.Second
)

// WithPublishPrefix sets the prefix of the keys the Publisher writes: the
// prefix the limiters and the dashboard use: no '{' or '}', or one hash
// tag, as throttle.WithPrefix allows. Default: "throttle:"
// (throttle.DefaultPrefix).
func WithPublishPrefix(prefix string) PublisherOption {
	return publisherOptionFunc(func(c *publisherConfig) error {
		if err := keyspace.CheckPrefix(prefix); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidOption, err)
		}
		c.prefix = prefix
		return nil
	})
}

// WithFlushInterval sets the time between two flushes, from 100ms to
// 30s; the dashboard's charts lag by up to one. Default: 2s.
func WithFlushInterval(d time.Duration) PublisherOption {
	return publisherOptionFunc(func(c *publisherConfig) error {
		if d < minFlushInterval || d > maxFlushInterval {
			return fmt.Errorf("%w: flush interval %s is not from %s to %s", ErrInvalidOption, d, minFlushInterval, maxFlushInterval)
		}
		c.interval = d
		return nil
	})
}

// WithKeysPerLimiter sets the most caller keys counted per limiter between
// two flushes, 1 at least; decisions for further keys count in the
// limiter's totals only. Default: 1000.
func WithKeysPerLimiter(n int) PublisherOption {
	return publisherOptionFunc(func(c *publisherConfig) error {
		if n < 1 {
			return fmt.Errorf("%w: keys per limiter must be at least 1, got %d", ErrInvalidOption, n)
		}
		c.keys = n
		return nil
	})
}

// WithPublisherLogger sets where the Publisher logs: failed flushes, at Warn
// and at most once a minute, and limiters beyond its bound. nil discards.
// Default: slog.Default().
func WithPublisherLogger(l *slog.Logger) PublisherOption {
	return publisherOptionFunc(func(c *publisherConfig) error {
		if l == nil {
			l = slog.New(slog.DiscardHandler)
		}
		c.logger = l
		return nil
	})
}

// WithProcessName sets the name the dashboard lists this process under.
// It must not be empty. Default: the hostname and the process ID,
// "host:1234".
func WithProcessName(name string) PublisherOption {
	return publisherOptionFunc(func(c *publisherConfig) error {
		if name == "" {
			return fmt.Errorf("%w: empty process name", ErrInvalidOption)
		}
		c.process = name
		return nil
	})
}
