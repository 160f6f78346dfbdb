package metrics

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// ErrInvalidOption reports a bad option given to [New]: a namespace that is
// not a valid metric name prefix, bucket bounds that are not positive,
// finite and strictly increasing, or a nil option. It is wrapped with
// detail: test for it with [errors.Is].
var ErrInvalidOption = errors.New("metrics: invalid option")

// DefaultNamespace starts the name of every series unless changed with
// [WithNamespace].
const DefaultNamespace = "jobthrottle"

// DefaultLatencyBuckets returns the upper bounds, in seconds, of the
// decision latency histogram unless changed with [WithLatencyBuckets]:
// 100µs to 2.5s. A decision is one Redis round trip (a few hundred
// microseconds on a local network); the upper buckets catch slow or timing
// out Redis. Each call returns a new slice.
func DefaultLatencyBuckets() []float64 {
	return []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}
}

// DefaultWaitBuckets returns the upper bounds, in seconds, of the worker's
// wait histogram unless changed with [WithWaitBuckets]: 10ms to 1h. Inline
// waits are below the worker's inline wait (1s by default); rescheduled
// tasks are away from about a second to as far ahead as their rule books.
// Each call returns a new slice.
func DefaultWaitBuckets() []float64 {
	return []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}
}

// Option configures a [Collector]; pass options to [New].
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

// config holds the options; see defaultConfig for the defaults.
type config struct {
	namespace      string
	latencyBuckets []float64
	waitBuckets    []float64
}

func defaultConfig() config {
	return config{
		namespace:      DefaultNamespace,
		latencyBuckets: DefaultLatencyBuckets(),
		waitBuckets:    DefaultWaitBuckets(),
	}
}

// WithNamespace sets the prefix of every series name: namespace
// "jobthrottle" gives jobthrottle_decisions_total. It must start with a
// letter or '_' and hold only ASCII letters, digits and '_'. Default:
// [DefaultNamespace].
func WithNamespace(namespace string) Option {
	return optionFunc(func(c *config) error {
		if !validNamespace(namespace) {
			return fmt.Errorf("%w: namespace %q must match [a-zA-Z_][a-zA-Z0-9_]*", ErrInvalidOption, namespace)
		}
		c.namespace = namespace
		return nil
	})
}

// WithLatencyBuckets sets the upper bounds, in seconds, of the
// decision_duration_seconds histogram's buckets. They must be positive,
// finite and strictly increasing; the +Inf bucket is always added. The
// slice is copied. Default: [DefaultLatencyBuckets].
func WithLatencyBuckets(bounds ...float64) Option {
	return optionFunc(func(c *config) error {
		if err := validBuckets(bounds); err != nil {
			return fmt.Errorf("%w: latency buckets: %w", ErrInvalidOption, err)
		}
		c.latencyBuckets = slices.Clone(bounds)
		return nil
	})
}

// WithWaitBuckets sets the upper bounds, in seconds, of the
// worker_wait_seconds histogram's buckets. They must be positive, finite
// and strictly increasing; the +Inf bucket is always added. The slice is
// copied. Default: [DefaultWaitBuckets].
func WithWaitBuckets(bounds ...float64) Option {
	return optionFunc(func(c *config) error {
		if err := validBuckets(bounds); err != nil {
			return fmt.Errorf("%w: wait buckets: %w", ErrInvalidOption, err)
		}
		c.waitBuckets = slices.Clone(bounds)
		return nil
	})
}

// validNamespace reports whether s can start a Prometheus metric name.
// Colons are allowed in metric names but reserved for recording rules, so
// they are refused here.
func validNamespace(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		switch {
		case r == '_', r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z':
		case r >= '0' && r <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// validBuckets checks histogram bucket bounds.
func validBuckets(bounds []float64) error {
	if len(bounds) == 0 {
		return errors.New("at least one bound is needed")
	}
	for i, b := range bounds {
		switch {
		case math.IsNaN(b) || math.IsInf(b, 0):
			return fmt.Errorf("bound %d is %v, want a finite number", i, b)
		case b <= 0:
			return fmt.Errorf("bound %d is %v, want a positive number", i, b)
		case i > 0 && b <= bounds[i-1]:
			return fmt.Errorf("bound %d (%v) is not above bound %d (%v)", i, b, i-1, bounds[i-1])
		}
	}
	return nil
}
