package httpthrottle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/gate"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// ErrNoKey reports a request the key function could not key.
var ErrNoKey = errors.New("httpthrottle: no key for request")

// Transport is an http.RoundTripper that paces outbound requests on a
// shared limiter: before each request it waits its turn, fleet-wide, under
// the request's key (its host by default), honouring the request's context.
// When the upstream answers 429 or 503 with a Retry-After, the key is
// blocked in Redis until then, so that every process sharing the Redis backs
// off, not only the one that was told. Responses are returned as they came;
// a throttled request is retried only when asked ([WithRetries]) and only
// if it is safe to send again. A Transport is safe for concurrent use.
type Transport struct {
	limiter  *throttle.Limiter
	base     http.RoundTripper
	key      func(*http.Request) (string, error)
	cost     func(*http.Request) (int, error) // nil: 1
	retries  int
	statuses []int
	maxBlock time.Duration
	observe  func(context.Context, Event) // nil: none
}

// TransportOption configures a Transport.
type TransportOption interface {
	applyTransport(*Transport) error
}

type transportOptionFunc func(*Transport) error

func (f transportOptionFunc) applyTransport(t *Transport) error { return f(t) }

// ErrInvalidOption reports a bad option or a nil limiter.
var ErrInvalidOption = errors.New("httpthrottle: invalid option")

// NewTransport returns a Transport pacing requests on limiter.
//
// Options and their defaults:
//
//	WithBase(rt)               http.DefaultTransport   sends the requests
//	WithRequestKey(f)          the request's host      the limiter key
//	WithRequestCost(f)         1                       units a request takes
//	WithRetries(n)             0                       retries of a 429/503
//	WithBackoffStatuses(c...)  429, 503                answers whose Retry-After blocks the key
//	WithMaxBlock(d)            1 hour                  longest block a Retry-After may set
//	WithTransportObserver(f)   none                    told of waits and back-offs
func NewTransport(limiter *throttle.Limiter, opts ...TransportOption) (*Transport, error) {
	if limiter == nil {
		return nil, fmt.Errorf("%w: nil limiter", ErrInvalidOption)
	}
	t := &Transport{
		limiter:  limiter,
		base:     http.DefaultTransport,
		key:      hostKey,
		statuses: []int{http.StatusTooManyRequests, http.StatusServiceUnavailable},
		maxBlock: time.Hour,
	}
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("%w: nil option", ErrInvalidOption)
		}
		if err := opt.applyTransport(t); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// WithBase sets the RoundTripper that sends the requests.
func WithBase(rt http.RoundTripper) TransportOption {
	return transportOptionFunc(func(t *Transport) error {
		if rt == nil {
			return fmt.Errorf("%w: nil base RoundTripper", ErrInvalidOption)
		}
		t.base = rt
		return nil
	})
}

// WithRequestKey keys requests with f, for example by the partner account a
// request is made for. Default: the request's host, lowercased.
func WithRequestKey(f func(*http.Request) (string, error)) TransportOption {
	return transportOptionFunc(func(t *Transport) error {
		if f == nil {
			return fmt.Errorf("%w: nil key function", ErrInvalidOption)
		}
		t.key = f
		return nil
	})
}

// WithRetries lets the Transport send a request again, up to n times, when
// the upstream answers with a backoff status: after the block its
// Retry-After set. Only requests that are safe to replay are retried: an
// idempotent method (GET, HEAD, OPTIONS, TRACE, PUT, DELETE) or an
// Idempotency-Key header, and a body that can be had again (none, or
// GetBody set, as http.NewRequest does for in-memory bodies); and not when
// the block would outlast the request's context: its answer comes back.
// Default: 0.
func WithRetries(n int) TransportOption {
	return transportOptionFunc(func(t *Transport) error {
		if n < 0 {
			return fmt.Errorf("%w: retries must not be negative, got %d", ErrInvalidOption, n)
		}
		t.retries = n
		return nil
	})
}

// WithBackoffStatuses sets the response statuses whose Retry-After blocks
// the key. Default: 429 and 503.
func WithBackoffStatuses(codes ...int) TransportOption {
	return transportOptionFunc(func(t *Transport) error {
		t.statuses = slices.Clone(codes)
		return nil
	})
}

// WithMaxBlock caps how long one Retry-After may block a key. Default: an
// hour.
func WithMaxBlock(d time.Duration) TransportOption {
	return transportOptionFunc(func(t *Transport) error {
		if d <= 0 {
			return fmt.Errorf("%w: max block must be positive, got %s", ErrInvalidOption, d)
		}
		t.maxBlock = d
		return nil
	})
}

// WithRequestCost sets how many units of the limit a request takes: an
// upstream that counts a batch call as 10 of its quota gets cost 10. f
// returns at least 1; a cost above the policy's capacity can never be
// admitted, and RoundTrip fails with an error wrapping
// throttle.ErrExceedsLimit, as it does for an error of f's own. Default:
// every request takes 1.
func WithRequestCost(f func(*http.Request) (int, error)) TransportOption {
	return transportOptionFunc(func(t *Transport) error {
		if f == nil {
			return fmt.Errorf("%w: nil cost function", ErrInvalidOption)
		}
		t.cost = f
		return nil
	})
}

// costOf returns the units req takes.
func (t *Transport) costOf(req *http.Request) (int, error) {
	if t.cost == nil {
		return 1, nil
	}
	n, err := t.cost(req)
	if err == nil && n < 1 {
		err = fmt.Errorf("%w: a request costs at least 1 unit, got %d", throttle.ErrInvalidN, n)
	}
	return n, err
}

// hostKey keys a request by its host.
func hostKey(req *http.Request) (string, error) {
	host := req.URL.Host
	if host == "" {
		host = req.Host
	}
	if host == "" {
		return "", fmt.Errorf("%w: request has no host", ErrNoKey)
	}
	return strings.ToLower(host), nil
}

// RoundTrip waits for the request's turn, sends it, and blocks the key on a
// backoff answer with a Retry-After. An error of the limiter (its context
// ended, or Redis could not decide under fail-closed) is returned without
// sending the request.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	key, err := t.key(req)
	switch {
	case err != nil && !errors.Is(err, ErrNoKey):
		err = fmt.Errorf("%w: %w", ErrNoKey, err)
	case err == nil && key == "":
		err = fmt.Errorf("%w: empty key", ErrNoKey)
	}
	var n int
	if err == nil {
		n, err = t.costOf(req)
	}
	if err != nil {
		closeBody(req)
		return nil, fmt.Errorf("httpthrottle: %s %s: %w", req.Method, req.URL.Redacted(), err)
	}
	for attempt := 0; ; attempt++ {
		began := time.Now()
		err := t.waitTurn(req.Context(), key, n)
		t.report(req.Context(), Event{Kind: Waited, Key: key, Attempt: attempt, Delay: time.Since(began), Err: err})
		if err != nil {
			closeBody(req)
			return nil, err
		}
		resp, err := t.base.RoundTrip(req)
		if err != nil || !slices.Contains(t.statuses, resp.StatusCode) {
			return resp, err
		}
		wait, ok := retryAfter(resp.Header, time.Now())
		if !ok || wait <= 0 {
			return resp, nil
		}
		block := min(wait, t.maxBlock)
		err = t.limiter.BlockFor(req.Context(), key, block)
		// A retry whose block outlasts the context could only fail: the
		// caller gets the answer instead.
		deadline, bounded := req.Context().Deadline()
		retrying := err == nil && attempt < t.retries && replayable(req) && (!bounded || time.Now().Add(block).Before(deadline))
		t.report(req.Context(), Event{Kind: BackedOff, Key: key, Attempt: attempt, Delay: block,
			Status: resp.StatusCode, Retrying: retrying, Err: err})
		if !retrying {
			return resp, nil // the answer is the caller's; a block is best effort
		}
		next, err := rewind(req)
		if err != nil {
			return resp, nil
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		req = next
	}
}

// report tells the observer of e, if there is one.
func (t *Transport) report(ctx context.Context, e Event) {
	if t.observe != nil {
		e.Limiter = t.limiter.Name()
		t.observe(ctx, e)
	}
}

// waitTurn waits until key admits the request's n units. On TokenBucket and GCRA it
// books a slot and sleeps until it; a block set meanwhile by another
// process (an upstream's 429) is checked on waking, and the slot given back.
func (t *Transport) waitTurn(ctx context.Context, key string, n int) error {
	if !gate.Meter(t.limiter) {
		return t.limiter.WaitN(ctx, key, n)
	}
	for {
		maxDelay := 10 * 365 * 24 * time.Hour
		if deadline, ok := ctx.Deadline(); ok {
			maxDelay = max(0, time.Until(deadline))
		}
		res, err := t.limiter.Reserve(ctx, key, n, maxDelay)
		if err != nil {
			return err
		}
		if !res.OK {
			return fmt.Errorf("httpthrottle: the turn of %q comes %s after the context's deadline: %w", key, res.RetryAfter, context.DeadlineExceeded)
		}
		if res.Delay == 0 {
			return nil // decided now: a block would have been seen
		}
		if err := res.Wait(ctx); err != nil {
			return err
		}
		blocked, err := t.limiter.BlockedFor(ctx, key)
		if err != nil || blocked == 0 {
			return err
		}
		// Cancel waits while ctx lives, and finishes in the background
		// after it ends.
		_ = res.Cancel(ctx)
	}
}

// replayable reports whether req may be sent again.
func replayable(req *http.Request) bool {
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
	default:
		if req.Header.Get("Idempotency-Key") == "" && req.Header.Get("X-Idempotency-Key") == "" {
			return false
		}
	}
	return req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
}

// rewind returns a copy of req to send again, with a fresh body.
func rewind(req *http.Request) (*http.Request, error) {
	next := req.Clone(req.Context())
	if req.Body != nil && req.Body != http.NoBody {
		body, err := req.GetBody()
		if err != nil {
			return nil, err
		}
		next.Body = body
	}
	return next, nil
}

// closeBody closes a request body the RoundTripper will not send, as the
// http.RoundTripper contract asks.
func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}
