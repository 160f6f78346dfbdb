package throttleotel

import (
	"errors"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the tracer and meter: the
// package's import path.
const ScopeName = "github.com/jobthrottle/jobthrottle/throttleotel"

// ErrInvalidOption reports a bad option given to [New]. It is wrapped with
// detail: test for it with errors.Is.
var ErrInvalidOption = errors.New("throttleotel: invalid option")

// Instrumentation turns what jobthrottle's limiters, worker middleware and
// HTTP wrappers observe into OpenTelemetry spans, span events and metrics.
// It is a throttle.Observer and a worker.Observer; its TransportOption and
// MiddlewareOption wire the HTTP wrappers.
//
// An Instrumentation is safe for concurrent use; one may serve any number
// of limiters, Throttlers, Transports and Middlewares. The zero value is not
// usable: call [New].
type Instrumentation struct {
	tracer trace.Tracer
	keys   KeyMode
	m      instruments
	// sets caches the attribute sets of the metrics, by what they hold.
	sets attrCache
}

// KeyMode says whether spans carry caller keys; see [WithKeys].
type KeyMode int

const (
	// KeysOmitted: spans carry no caller key (the default).
	KeysOmitted KeyMode = iota
	// KeysHashed: spans carry jobthrottle.key.hash, the first 16 hex digits
	// of the key's SHA-256, so that one key's decisions can be followed
	// without its value being exported. It hides a key from a reader, not
	// from someone who can guess it and hash the guess.
	KeysHashed
	// KeysRaw: spans carry the key itself as jobthrottle.key.
	KeysRaw
)

// Option configures an [Instrumentation]; pass options to [New].
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	tp   trace.TracerProvider
	mp   metric.MeterProvider
	keys KeyMode
}

// WithTracerProvider sets where spans and span events go. Default: the
// global provider (otel.GetTracerProvider), read once, by New.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) error {
		if tp == nil {
			return fmt.Errorf("%w: nil TracerProvider", ErrInvalidOption)
		}
		c.tp = tp
		return nil
	})
}

// WithMeterProvider sets where metrics go. Default: the global provider
// (otel.GetMeterProvider), read once, by New.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) error {
		if mp == nil {
			return fmt.Errorf("%w: nil MeterProvider", ErrInvalidOption)
		}
		c.mp = mp
		return nil
	})
}

// WithKeys puts caller keys on spans and span events, raw or hashed (see
// [KeyMode]). Metrics never carry keys. Default: [KeysOmitted].
func WithKeys(mode KeyMode) Option {
	return optionFunc(func(c *config) error {
		if mode < KeysOmitted || mode > KeysRaw {
			return fmt.Errorf("%w: unknown KeyMode %d", ErrInvalidOption, int(mode))
		}
		c.keys = mode
		return nil
	})
}

// New returns an Instrumentation reporting to the global providers unless
// options say otherwise.
//
// Options and their defaults:
//
//	WithTracerProvider(tp)  otel.GetTracerProvider()  where spans go
//	WithMeterProvider(mp)   otel.GetMeterProvider()   where metrics go
//	WithKeys(mode)          KeysOmitted               caller keys on spans
//
// Errors wrap [ErrInvalidOption], or are the meter's own.
func New(opts ...Option) (*Instrumentation, error) {
	var cfg config
	for i, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("%w: option %d is nil", ErrInvalidOption, i)
		}
		if err := opt.apply(&cfg); err != nil {
			return nil, err
		}
	}
	if cfg.tp == nil {
		cfg.tp = otel.GetTracerProvider()
	}
	if cfg.mp == nil {
		cfg.mp = otel.GetMeterProvider()
	}
	m, err := newInstruments(cfg.mp.Meter(ScopeName))
	if err != nil {
		return nil, fmt.Errorf("throttleotel: creating instruments: %w", err)
	}
	return &Instrumentation{tracer: cfg.tp.Tracer(ScopeName), keys: cfg.keys, m: m}, nil
}
