package httpthrottle

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/jobthrottle/jobthrottle/throttle"
)

// Middleware limits inbound HTTP requests per client on a shared limiter,
// answering 429 with Retry-After when a client is over its limit, and
// advertising the limit on every response: the RateLimit-Policy and
// RateLimit fields of the IETF httpapi draft
// (draft-ietf-httpapi-ratelimit-headers) and the X-RateLimit-Limit,
// -Remaining and -Reset trio. A Middleware is safe for concurrent use.
type Middleware struct {
	limiter *throttle.Limiter
	key     func(*http.Request) (string, error)
	trusted []netip.Prefix
	name    string
	logger  *slog.Logger
	observe func(context.Context, Event) // nil: none
}

// MiddlewareOption configures a Middleware.
type MiddlewareOption interface {
	applyMiddleware(*Middleware) error
}

type middlewareOptionFunc func(*Middleware) error

func (f middlewareOptionFunc) applyMiddleware(m *Middleware) error { return f(m) }

// NewMiddleware returns a Middleware limiting requests on limiter. The
// limiter's failure policy decides what happens when Redis cannot answer:
// fail-closed answers 503, fail-open lets the request through.
//
// Options and their defaults:
//
//	WithClientKey(f)          the client's IP address   the limiter key
//	WithTrustedProxies(c...)  none                      proxies whose X-Forwarded-For is believed
//	WithPolicyName(s)         "default"                 the policy's name in the RateLimit fields
//	WithLogger(l)             slog.Default()            where failures to decide are logged
//	WithMiddlewareObserver(f) none                      told of every decision's answer
func NewMiddleware(limiter *throttle.Limiter, opts ...MiddlewareOption) (*Middleware, error) {
	if limiter == nil {
		return nil, fmt.Errorf("%w: nil limiter", ErrInvalidOption)
	}
	m := &Middleware{limiter: limiter, name: "default", logger: slog.Default()}
	m.key = func(r *http.Request) (string, error) {
		ip, err := clientIP(r, m.trusted)
		return ip.String(), err
	}
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("%w: nil option", ErrInvalidOption)
		}
		if err := opt.applyMiddleware(m); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// WithClientKey keys requests with f instead of the client's IP address,
// for example by API key. A request f cannot key is answered 400.
func WithClientKey(f func(*http.Request) (string, error)) MiddlewareOption {
	return middlewareOptionFunc(func(m *Middleware) error {
		if f == nil {
			return fmt.Errorf("%w: nil key function", ErrInvalidOption)
		}
		m.key = f
		return nil
	})
}

// WithTrustedProxies names the proxies (CIDR prefixes or single addresses)
// in front of the server: for a request from one of them, the client is
// the rightmost address of X-Forwarded-For that is not one of them. Without
// this option the connection's peer is the client, whatever headers say.
func WithTrustedProxies(cidrs ...string) MiddlewareOption {
	return middlewareOptionFunc(func(m *Middleware) error {
		for _, c := range cidrs {
			p, err := netip.ParsePrefix(c)
			if err != nil {
				addr, addrErr := netip.ParseAddr(c)
				if addrErr != nil {
					return fmt.Errorf("%w: trusted proxy %q: %w", ErrInvalidOption, c, err)
				}
				p = netip.PrefixFrom(addr.Unmap(), addr.Unmap().BitLen())
			}
			m.trusted = append(m.trusted, p.Masked())
		}
		return nil
	})
}

// WithPolicyName names the policy in the RateLimit and RateLimit-Policy
// fields: printable ASCII, without a quote or a backslash. Default:
// "default".
func WithPolicyName(name string) MiddlewareOption {
	return middlewareOptionFunc(func(m *Middleware) error {
		// The fields carry it as a structured field string: printable
		// ASCII, and no quote or backslash (which would need escapes).
		if name == "" || strings.ContainsAny(name, "\"\\") || strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r > 0x7e }) {
			return fmt.Errorf("%w: policy name %q: printable ASCII without \" or \\", ErrInvalidOption, name)
		}
		m.name = name
		return nil
	})
}

// WithLogger sets where failures to decide are logged. Default:
// slog.Default().
func WithLogger(l *slog.Logger) MiddlewareOption {
	return middlewareOptionFunc(func(m *Middleware) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrInvalidOption)
		}
		m.logger = l
		return nil
	})
}

// Handler returns next behind the limit.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, err := m.key(r)
		if err == nil && key == "" {
			err = fmt.Errorf("%w: empty key", ErrNoKey)
		}
		if err != nil {
			http.Error(w, "cannot identify the client", http.StatusBadRequest)
			return
		}
		res, err := m.limiter.Allow(r.Context(), key)
		switch {
		case err != nil:
			if r.Context().Err() != nil {
				return // the client has gone: nobody to answer
			}
			// Redis could not decide (under fail-closed), or refused the
			// command under either policy (a wrong type at the key, a
			// command the user may not run): the request is not served.
			m.logger.Error("httpthrottle: rate limit undecided, request refused", "key", key, "err", err)
			m.report(r.Context(), Event{Kind: Unavailable, Key: key, Status: http.StatusServiceUnavailable, Err: err})
			w.Header().Set("Retry-After", "1")
			http.Error(w, "rate limit unavailable", http.StatusServiceUnavailable)
			return
		case res.Degraded:
			m.report(r.Context(), Event{Kind: Degraded, Key: key})
			next.ServeHTTP(w, r) // fail-open: nothing known to advertise
			return
		}
		m.writeFields(w.Header(), res)
		if !res.Allowed {
			m.report(r.Context(), Event{Kind: Rejected, Key: key, Delay: res.RetryAfter, Status: http.StatusTooManyRequests})
			w.Header().Set("Retry-After", strconv.FormatInt(ceilSeconds(res.RetryAfter, 1), 10))
			http.Error(w, "rate limit exceeded", http.StatusTooManyRequests)
			return
		}
		m.report(r.Context(), Event{Kind: Admitted, Key: key})
		next.ServeHTTP(w, r)
	})
}

// report tells the observer of e, if there is one.
func (m *Middleware) report(ctx context.Context, e Event) {
	if m.observe != nil {
		e.Limiter = m.limiter.Name()
		m.observe(ctx, e)
	}
}

// writeFields sets the rate limit fields of a decision.
func (m *Middleware) writeFields(h http.Header, res throttle.Result) {
	reset := strconv.FormatInt(ceilSeconds(res.ResetAfter, 0), 10)
	policy := res.Policy() // the one in force: a live or per-key one too
	if policy == nil {
		policy = m.limiter.Policy()
	}
	quota, window := policyQuota(policy)
	h.Set("RateLimit-Policy", fmt.Sprintf("%q;q=%d;w=%d", m.name, quota, ceilSeconds(window, 1)))
	h.Set("RateLimit", fmt.Sprintf("%q;r=%d;t=%s", m.name, res.Remaining, reset))
	h.Set("X-RateLimit-Limit", strconv.Itoa(res.Limit))
	h.Set("X-RateLimit-Remaining", strconv.Itoa(res.Remaining))
	h.Set("X-RateLimit-Reset", reset)
}

// policyQuota returns a policy as q units per w: the window policies'
// Limit per Window; for the meters their capacity and the time it takes to
// refill it at their rate (GCRA of 100/min, burst 5: 5 per 3 s).
func policyQuota(p throttle.Policy) (int, time.Duration) {
	switch p := p.(type) {
	case throttle.FixedWindow:
		return p.Limit, p.Window
	case throttle.SlidingLog:
		return p.Limit, p.Window
	case throttle.SlidingWindow:
		return p.Limit, p.Window
	case throttle.TokenBucket:
		return p.Burst, refill(p.Rate, p.Burst)
	case throttle.LeakyBucket:
		return p.Capacity, refill(p.Rate, p.Capacity)
	case throttle.GCRA:
		return p.Burst, refill(p.Rate, p.Burst)
	case throttle.Quota:
		if p.Period == throttle.Month {
			return p.Limit, 30 * 24 * time.Hour // a month, as advertised in seconds
		}
		return p.Limit, 24 * time.Hour
	}
	return 0, 0
}

// refill is how long r takes to refill units (rounded: it is advertised in
// whole seconds).
func refill(r throttle.Rate, units int) time.Duration {
	return time.Duration(float64(r.Per) * float64(units) / float64(r.N))
}
