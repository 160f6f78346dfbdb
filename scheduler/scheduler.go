package scheduler

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/jobthrottle/jobthrottle/internal/redisclient"
	"github.com/redis/go-redis/v9"
)

var (
	// ErrInvalidEntry reports an entry, option or batch the scheduler cannot
	// use: a bad cron spec, a duplicate name, a nil producer.
	ErrInvalidEntry = errors.New("scheduler: invalid entry")

	// ErrProducerPanicked is wrapped by the EntryError of a producer that
	// panicked.
	ErrProducerPanicked = errors.New("scheduler: producer panicked")

	// ErrStarted reports Add or Start on a scheduler already started, or
	// Start on a stopped one.
	ErrStarted = errors.New("scheduler: already started")

	// ErrInvalidOption reports a bad option, or a nil client, given to New.
	ErrInvalidOption = errors.New("scheduler: invalid option")
)

// EntryError is a failure of one tick of one entry: its producer failed or
// panicked, or its batch could not be booked or enqueued. The scheduler
// goes on: the entry's next tick and the other entries run as usual.
type EntryError struct {
	Entry string
	Tick  time.Time
	Err   error
}

// Error describes the failure.
func (e *EntryError) Error() string {
	return fmt.Sprintf("scheduler: entry %q, tick %s: %v", e.Entry, e.Tick.Format(time.RFC3339), e.Err)
}

// Unwrap returns the cause.
func (e *EntryError) Unwrap() error { return e.Err }

// Scheduler fires batch-producing entries on cron schedules. Any number of
// replicas may run the same entries on one Redis: each tick fires on exactly
// one of them. Add entries, then Start; Stop before the process exits. A
// Scheduler is safe for concurrent use; the zero value is not usable: call
// [New].
type Scheduler struct {
	client  redis.UniversalClient
	enqueue *asynq.Client
	cfg     config
	replica string
	clock   clock

	mu      sync.Mutex
	entries []*entry
	state   int // 0 new, 1 started, 2 stopped
	cancel  context.CancelFunc
	running sync.WaitGroup
}

type config struct {
	prefix   string
	logger   *slog.Logger
	onError  func(*EntryError)
	location *time.Location
}

// Option configures a Scheduler.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

// WithPrefix sets the start of the Redis keys of the tick claims. It holds
// no '{' or '}', or one hash tag, as throttle.WithPrefix allows. Default:
// "throttle:".
func WithPrefix(prefix string) Option {
	return optionFunc(func(c *config) error {
		if err := keyspace.CheckPrefix(prefix); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidOption, err)
		}
		c.prefix = prefix
		return nil
	})
}

// WithLogger sets where entry failures are logged. Default: slog.Default().
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrInvalidOption)
		}
		c.logger = l
		return nil
	})
}

// WithErrorHandler calls f with every entry failure, besides logging it.
// f is called on the entry's goroutine. Default: none.
func WithErrorHandler(f func(*EntryError)) Option {
	return optionFunc(func(c *config) error {
		c.onError = f
		return nil
	})
}

// WithLocation sets the time zone of specs that do not name one with
// CRON_TZ=. Default: UTC, so that replicas whose machines are set to
// different zones agree on every tick ("0 2 * * *" is 02:00 UTC), as
// asynq's own scheduler does.
func WithLocation(loc *time.Location) Option {
	return optionFunc(func(c *config) error {
		if loc == nil {
			return fmt.Errorf("%w: nil location", ErrInvalidOption)
		}
		c.location = loc
		return nil
	})
}

// New returns a Scheduler that claims ticks in, and enqueues tasks into,
// the Redis behind client.
//
// Options and their defaults:
//
//	WithPrefix(s)         "throttle:"       start of the claims' keys
//	WithLogger(l)         slog.Default()    where entry failures are logged
//	WithErrorHandler(f)   none              called with each entry failure
//	WithLocation(loc)     time.UTC          zone of specs without CRON_TZ=
//
// Errors wrap ErrInvalidOption.
func New(client redis.UniversalClient, opts ...Option) (*Scheduler, error) {
	if redisclient.IsNil(client) {
		return nil, fmt.Errorf("%w: nil redis client", ErrInvalidOption)
	}
	redisclient.FollowFailovers(client)
	cfg := config{prefix: "throttle:", logger: slog.Default(), location: time.UTC}
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("%w: nil option", ErrInvalidOption)
		}
		if err := opt.apply(&cfg); err != nil {
			return nil, err
		}
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	return &Scheduler{client: client, enqueue: asynq.NewClientFromRedisClient(client), cfg: cfg,
		replica: hex.EncodeToString(id[:]), clock: realClock{}}, nil
}

// Add registers an entry: on every tick of spec, on one replica, producer
// makes a batch of tasks, which are enqueued (paced, with [PacedBy]) with
// the IDs name@tick:index, so that a tick run twice never enqueues a task
// twice. spec is a cron spec with optional seconds ("*/5 * * * * *" is
// every 5 s, "0 2 * * *" nightly at 02:00), a descriptor ("@hourly",
// "@every 30s", which ticks at the multiples of 30 s since the Unix epoch,
// the same instants on every replica), and may start with CRON_TZ=<zone>.
// Errors wrap ErrInvalidEntry, or ErrStarted once the scheduler has
// started.
func (s *Scheduler) Add(name, spec string, producer Producer, opts ...BatchOption) error {
	if name == "" || producer == nil {
		return fmt.Errorf("%w: an entry needs a name and a producer", ErrInvalidEntry)
	}
	schedule, err := parseSpec(spec, s.cfg.location)
	if err != nil {
		return fmt.Errorf("%w: entry %q: spec %q: %w", ErrInvalidEntry, name, spec, err)
	}
	batch, err := newBatchConfig(opts)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != 0 {
		return fmt.Errorf("%w: Add(%q) after Start", ErrStarted, name)
	}
	for _, e := range s.entries {
		if e.name == name {
			return fmt.Errorf("%w: two entries are named %q", ErrInvalidEntry, name)
		}
	}
	s.entries = append(s.entries, &entry{name: name, schedule: schedule, producer: producer, batch: batch})
	return nil
}

// Start runs the entries in the background until Stop.
func (s *Scheduler) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != 0 {
		return ErrStarted
	}
	s.state = 1
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	for _, e := range s.entries {
		s.running.Add(2)
		go func() {
			defer s.running.Done()
			s.run(ctx, e)
		}()
		go func() {
			defer s.running.Done()
			s.recoverTicks(ctx, e)
		}()
	}
	return nil
}

// Stop stops firing ticks, cancels the context of producers still running
// and waits for them to return, or for ctx to end, whichever comes first;
// in the latter case it returns ctx's error. The ticks of producers cut
// short are released at once, and another replica produces them again
// within a few seconds (see the package documentation). Stop again waits
// again for the producers a stop that ran out of time left running. Stop
// on a scheduler never started returns nil.
func (s *Scheduler) Stop(ctx context.Context) error {
	s.mu.Lock()
	switch s.state {
	case 0:
		s.state = 2
		s.mu.Unlock()
		return nil
	case 1:
		s.state = 2
		s.cancel()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() {
		s.running.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("scheduler: stop: %w", ctx.Err())
	}
}

// report logs an entry failure and passes it to the error handler.
func (s *Scheduler) report(err *EntryError) {
	s.cfg.logger.Error("scheduler: entry failed", "entry", err.Entry, "tick", err.Tick, "err", err.Err)
	if s.cfg.onError != nil {
		s.cfg.onError(err)
	}
}
