package dashboard

import (
	"fmt"
	"log/slog"
	"maps"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// Option configures a dashboard Handler.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	prefix   string
	token    string // actions are enabled when set
	pageSize int
	timeout  time.Duration
	logger   *slog.Logger
	policies map[string]throttle.Policy
}

// Defaults of the Handler's options.
const (
	// DefaultPageSize is how many keys a page of a limiter's keys shows.
	DefaultPageSize = 50
	// DefaultTimeout bounds the Redis calls of one request.
	DefaultTimeout = 5 * time.Second
)

// minTokenLength is the shortest token WithActions takes.
const minTokenLength = 16

// WithPrefix sets the start of the Redis keys the limiters and the
// Publishers write (throttle.WithPrefix, WithPublishPrefix): no '{' or
// '}', or one hash tag, as throttle.WithPrefix allows. Default:
// throttle.DefaultPrefix, "throttle:".
func WithPrefix(prefix string) Option {
	return optionFunc(func(c *config) error {
		if err := keyspace.CheckPrefix(prefix); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidOption, err)
		}
		c.prefix = prefix
		return nil
	})
}

// WithActions enables the dashboard's actions: reset a key, block or
// unblock it, set or remove a stored policy. Each is a POST that must carry
// token, typed into the page by the operator, and come from the
// dashboard's own page (requests another site makes a browser send are
// refused). token must be at least 16 characters. Default: no actions, the
// dashboard is read-only.
func WithActions(token string) Option {
	return optionFunc(func(c *config) error {
		if len(token) < minTokenLength {
			return fmt.Errorf("%w: the actions token must be at least %d characters, got %d", ErrInvalidOption, minTokenLength, len(token))
		}
		c.token = token
		return nil
	})
}

// WithCodePolicies gives the policies in code of limiters, by name, for
// those whose processes neither publish counts nor record themselves in
// the registry of names (every limiter does, on its first decision): the
// dashboard needs a limiter's policy to read its keys. A Publisher
// records the policy in code of every limiter it sees decide, and a
// policy stored for the name applies before either. Default: none.
func WithCodePolicies(policies map[string]throttle.Policy) Option {
	return optionFunc(func(c *config) error {
		for name, p := range policies {
			if name == "" {
				return fmt.Errorf("%w: a code policy for an empty limiter name", ErrInvalidOption)
			}
			if p == nil {
				return fmt.Errorf("%w: nil policy for limiter %q", ErrInvalidOption, name)
			}
			if err := p.Validate(); err != nil {
				return fmt.Errorf("%w: limiter %q: %w", ErrInvalidOption, name, err)
			}
		}
		c.policies = maps.Clone(policies)
		return nil
	})
}

// WithPageSize sets how many keys one page of a limiter's keys shows,
// from 1 to 1000. Default: [DefaultPageSize].
func WithPageSize(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 1 || n > 1000 {
			return fmt.Errorf("%w: page size must be from 1 to 1000, got %d", ErrInvalidOption, n)
		}
		c.pageSize = n
		return nil
	})
}

// WithTimeout bounds the Redis calls of one request. Default:
// [DefaultTimeout].
func WithTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: timeout must be positive, got %s", ErrInvalidOption, d)
		}
		c.timeout = d
		return nil
	})
}

// WithLogger sets where the Handler logs failed requests and actions
// taken, with log/slog. Default: slog.Default(). nil discards.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) error {
		if l == nil {
			l = slog.New(slog.DiscardHandler)
		}
		c.logger = l
		return nil
	})
}
