package httpthrottle

import (
	"context"
	"fmt"
	"time"
)

// EventKind says what a Transport or a Middleware did about a request.
type EventKind int

const (
	// Waited: the Transport waited for the request's turn before sending
	// it, for Delay (the limiter's round trips included; a request the
	// limit did not hold back waits only for them). With Err set the wait
	// failed (the request's context ended, or Redis could not decide under
	// fail-closed) and the request was not sent.
	Waited EventKind = iota
	// BackedOff: the upstream answered a backoff status (Status) with a
	// Retry-After, and the Transport blocked the key for Delay, fleet-wide.
	// Retrying says whether it sends the request again after the block.
	// With Err set the block could not be written (the answer is still
	// returned).
	BackedOff
	// Admitted: the Middleware let the request through.
	Admitted
	// Rejected: the Middleware answered 429, with a Retry-After of Delay.
	Rejected
	// Unavailable: Redis could not decide and the limiter fails closed: the
	// Middleware answered 503. Err is the limiter's error.
	Unavailable
	// Degraded: Redis could not decide and the limiter fails open: the
	// Middleware let the request through.
	Degraded
)

// String names the kind: "waited", "backed_off", "admitted", "rejected",
// "unavailable" or "degraded".
func (k EventKind) String() string {
	switch k {
	case Waited:
		return "waited"
	case BackedOff:
		return "backed_off"
	case Admitted:
		return "admitted"
	case Rejected:
		return "rejected"
	case Unavailable:
		return "unavailable"
	case Degraded:
		return "degraded"
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Event describes what a Transport or a Middleware did about one request,
// for the function given to [WithTransportObserver] or
// [WithMiddlewareObserver].
type Event struct {
	Kind EventKind
	// Limiter is the name of the limiter that decided.
	Limiter string
	// Key is the request's key. It is unbounded in number and may be a
	// client's address: never use it as a metric label.
	Key string
	// Attempt counts the Transport's sends of the request, from 0: a
	// retry after a back-off is attempt 1.
	Attempt int
	// Delay is the wait (Waited), the block set (BackedOff), or the
	// Retry-After answered (Rejected).
	Delay time.Duration
	// Status is the upstream's answer (BackedOff) or the Middleware's
	// (Rejected: 429, Unavailable: 503); zero otherwise.
	Status int
	// Retrying reports, for BackedOff, that the Transport will send the
	// request again once the block ends.
	Retrying bool
	// Err is the cause of a failed wait or block, or of Unavailable. (The
	// Redis failure behind Degraded is in the limiter's own decision, see
	// throttle.Decision.)
	Err error
}

// WithTransportObserver has the Transport call f for each request's wait
// for its turn (Waited) and each back-off an upstream asked for
// (BackedOff), synchronously, with the request's context: the hook for
// traces (see package throttleotel). f must be quick and safe for
// concurrent use. Default: none.
func WithTransportObserver(f func(context.Context, Event)) TransportOption {
	return transportOptionFunc(func(t *Transport) error {
		if f == nil {
			return fmt.Errorf("%w: nil observer", ErrInvalidOption)
		}
		t.observe = f
		return nil
	})
}

// WithMiddlewareObserver has the Middleware call f with what it did about
// each request it decided (Admitted, Rejected, Unavailable or Degraded),
// synchronously, with the request's context, before the request goes on
// or is answered. f must be quick and safe for concurrent use. Default:
// none.
func WithMiddlewareObserver(f func(context.Context, Event)) MiddlewareOption {
	return middlewareOptionFunc(func(m *Middleware) error {
		if f == nil {
			return fmt.Errorf("%w: nil observer", ErrInvalidOption)
		}
		m.observe = f
		return nil
	})
}
