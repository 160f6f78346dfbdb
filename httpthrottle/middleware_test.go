package httpthrottle_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/httpthrottle"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

var quiet = httpthrottle.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))

func okHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
}

// serve sends one request from the given address through h.
func serve(h http.Handler, remote string) *http.Response {
	req := httptest.NewRequest(http.MethodGet, "http://api.example/orders", nil)
	req.RemoteAddr = remote
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Result()
}

// TestInboundLimitAndHeaders: 5 requests per 10 s; the 6th is refused with
// Retry-After equal to the true wait rounded up, and every response carries
// exact rate limit fields.
func TestInboundLimitAndHeaders(t *testing.T) {
	for _, tc := range []struct {
		policy throttle.Policy
		// At 2.3 s into a window that started at a whole 10 s: the fields
		// of the 5 allowed responses and of the refused one.
		resets   []string
		retry    string
		policyHd string
	}{
		{throttle.FixedWindow{Limit: 5, Window: 10 * time.Second}, []string{"8", "8", "8", "8", "8", "8"}, "8", `"default";q=5;w=10`},
		{throttle.SlidingLog{Limit: 5, Window: 10 * time.Second}, []string{"10", "10", "10", "10", "10", "10"}, "10", `"default";q=5;w=10`},
		{throttle.GCRA{Rate: throttle.Rate{N: 5, Per: 10 * time.Second}, Burst: 5}, []string{"2", "4", "6", "8", "10", "10"}, "2", `"default";q=5;w=10`},
	} {
		t.Run(tcName(tc.policy), func(t *testing.T) {
			tg := redistest.Embedded(t)
			clock := tg.Clock(t)
			clock.Set(clock.Now().Truncate(10 * time.Second).Add(12300 * time.Millisecond))
			limiter, err := throttle.New(tg.Client, "limiter", tc.policy, throttle.WithPrefix(tg.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			m, err := httpthrottle.NewMiddleware(limiter, quiet)
			if err != nil {
				t.Fatal(err)
			}
			h := m.Handler(okHandler())
			for i := range 6 {
				resp := serve(h, "203.0.113.7:51000")
				wantStatus, remaining := http.StatusOK, 4-i
				if i == 5 {
					wantStatus, remaining = http.StatusTooManyRequests, 0
				}
				if resp.StatusCode != wantStatus {
					t.Fatalf("request %d: %d, want %d", i+1, resp.StatusCode, wantStatus)
				}
				want := map[string]string{
					"RateLimit-Policy":      tc.policyHd,
					"RateLimit":             `"default";r=` + itoa(remaining) + ";t=" + tc.resets[i],
					"X-RateLimit-Limit":     "5",
					"X-RateLimit-Remaining": itoa(remaining),
					"X-RateLimit-Reset":     tc.resets[i],
				}
				if i == 5 {
					want["Retry-After"] = tc.retry
				}
				for field, v := range want {
					if got := resp.Header.Get(field); got != v {
						t.Errorf("request %d: %s: %q, want %q", i+1, field, got, v)
					}
				}
			}
			// Another client has its own limit.
			if resp := serve(h, "198.51.100.2:4000"); resp.StatusCode != http.StatusOK {
				t.Fatalf("another client: %d", resp.StatusCode)
			}
		})
	}
}

func TestInboundWhenRedisIsDown(t *testing.T) {
	ln := deadRedis(t)
	for _, tc := range []struct {
		failure throttle.FailurePolicy
		status  int
	}{
		{throttle.FailClosed, http.StatusServiceUnavailable},
		{throttle.FailOpen, http.StatusOK},
	} {
		limiter, err := throttle.New(ln, "limiter", throttle.GCRA{Rate: throttle.PerSecond(5), Burst: 5}, throttle.WithFailurePolicy(tc.failure))
		if err != nil {
			t.Fatal(err)
		}
		m, _ := httpthrottle.NewMiddleware(limiter, quiet)
		resp := serve(m.Handler(okHandler()), "203.0.113.7:51000")
		if resp.StatusCode != tc.status {
			t.Errorf("%s with Redis down: %d, want %d", tc.failure, resp.StatusCode, tc.status)
		}
		if tc.failure == throttle.FailClosed && resp.Header.Get("Retry-After") == "" {
			t.Errorf("503 without Retry-After")
		}
	}
}

// TestInboundWhenRedisRefuses: a Redis that answers with an error (here a
// list where the limiter keeps its state: WRONGTYPE) decides nothing under
// either failure policy; the request gets 503 with Retry-After and is not
// served. (It once got an empty 200, taken for a client gone.) A request
// whose client has gone gets no answer.
func TestInboundWhenRedisRefuses(t *testing.T) {
	tg := redistest.New(t)
	ctx := context.Background()
	for _, failure := range []throttle.FailurePolicy{throttle.FailClosed, throttle.FailOpen} {
		limiter, err := throttle.New(tg.Client, "refused-"+failure.String(), throttle.GCRA{Rate: throttle.PerSecond(5), Burst: 5},
			throttle.WithPrefix(tg.Prefix), throttle.WithFailurePolicy(failure))
		if err != nil {
			t.Fatal(err)
		}
		if err := tg.Client.RPush(ctx, limiter.Key("203.0.113.7"), "not a limiter's state").Err(); err != nil {
			t.Fatal(err)
		}
		m, _ := httpthrottle.NewMiddleware(limiter, quiet)
		served := false
		h := m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served = true }))
		resp := serve(h, "203.0.113.7:51000")
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || served {
			t.Errorf("%s, Redis refusing: %d, Retry-After %q, served %v; want 503 with Retry-After, not served",
				failure, resp.StatusCode, resp.Header.Get("Retry-After"), served)
		}
		gone, cancel := context.WithCancel(ctx)
		cancel()
		req := httptest.NewRequest(http.MethodGet, "http://api.example/orders", nil).WithContext(gone)
		req.RemoteAddr = "203.0.113.7:51000"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Body.Len() > 0 || len(rec.Header()) > 0 || served {
			t.Errorf("%s, the client gone: answered %d %q, served %v; want no answer", failure, rec.Code, rec.Body.String(), served)
		}
	}
}

// TestThePolicyFieldIsThePolicyInForce: RateLimit-Policy names the policy
// that decided, a stored one for a live limiter (throttle.PolicyStore), not
// the one written in code, and agrees with X-RateLimit-Limit.
func TestThePolicyFieldIsThePolicyInForce(t *testing.T) {
	tg := redistest.New(t)
	ctx := context.Background()
	store, err := throttle.NewPolicyStore(tg.Client, tg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Set(ctx, "api", throttle.FixedWindow{Limit: 50, Window: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	limiter, err := throttle.New(tg.Client, "api", throttle.FixedWindow{Limit: 5, Window: 10 * time.Second},
		throttle.WithPrefix(tg.Prefix), throttle.WithLivePolicies())
	if err != nil {
		t.Fatal(err)
	}
	m, _ := httpthrottle.NewMiddleware(limiter, quiet)
	h := m.Handler(okHandler())
	deadline := time.Now().Add(3 * time.Second)
	for {
		resp := serve(h, "203.0.113.7:51000")
		got, limit := resp.Header.Get("RateLimit-Policy"), resp.Header.Get("X-RateLimit-Limit")
		if got == `"default";q=50;w=30` && limit == "50" {
			return
		}
		if limit == "50" || time.Now().After(deadline) {
			t.Fatalf("RateLimit-Policy %s with X-RateLimit-Limit %s; want the stored policy's, q=50;w=30", got, limit)
		}
		time.Sleep(50 * time.Millisecond) // the stored policy applies within a second
	}
}

// deadRedis returns a client of a Redis that is not there.
func deadRedis(t *testing.T) redis.UniversalClient {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: redistest.DeadAddr(t), MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { c.Close() })
	return c
}

func TestTrustedProxies(t *testing.T) {
	tg := redistest.Embedded(t)
	limiter, _ := throttle.New(tg.Client, "limiter", throttle.FixedWindow{Limit: 1, Window: redistest.FarWindow}, throttle.WithPrefix(tg.Prefix))
	send := func(h http.Handler, remote, xff string) int {
		req := httptest.NewRequest(http.MethodGet, "http://api.example/", nil)
		req.RemoteAddr = remote
		if xff != "" {
			req.Header.Set("X-Forwarded-For", xff)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	// Without trusted proxies the header is ignored: a client cannot pick
	// a fresh identity per request.
	plain, _ := httpthrottle.NewMiddleware(limiter, quiet)
	h := plain.Handler(okHandler())
	if send(h, "203.0.113.9:1", "1.1.1.1") != http.StatusOK || send(h, "203.0.113.9:1", "2.2.2.2") != http.StatusTooManyRequests {
		t.Fatal("X-Forwarded-For from an untrusted peer changed the client's key")
	}
	proxied, err := httpthrottle.NewMiddleware(limiter, quiet, httpthrottle.WithTrustedProxies("10.0.0.0/8", "192.0.2.1"))
	if err != nil {
		t.Fatal(err)
	}
	h = proxied.Handler(okHandler())
	for _, tc := range []struct {
		remote, xff string
		want        int
	}{
		{"10.1.1.1:80", "198.51.100.20", http.StatusOK},                         // client .20, first time
		{"10.1.1.1:80", "6.6.6.6, 198.51.100.20", http.StatusTooManyRequests},   // spoofed left part ignored
		{"192.0.2.1:80", "198.51.100.20, 10.9.9.9", http.StatusTooManyRequests}, // two trusted hops
		{"10.1.1.1:80", "198.51.100.21", http.StatusOK},                         // another client
		{"10.1.1.1:80", "bogus, 198.51.100.22", http.StatusOK},                  // malformed left of a real client
		{"10.1.1.1:80", "198.51.100.23:4711", http.StatusOK},                    // a hop written with its port
		{"10.1.1.1:80", "198.51.100.23", http.StatusTooManyRequests},            // the same client
		{"10.1.1.1:80", "[2001:db8::7]:443", http.StatusOK},                     // an IPv6 hop with its port
	} {
		if got := send(h, tc.remote, tc.xff); got != tc.want {
			t.Errorf("from %s with X-Forwarded-For %q: %d, want %d", tc.remote, tc.xff, got, tc.want)
		}
	}
	for _, opt := range []httpthrottle.MiddlewareOption{nil, httpthrottle.WithTrustedProxies("not a cidr"), httpthrottle.WithClientKey(nil), httpthrottle.WithPolicyName(`a"b`), httpthrottle.WithPolicyName("café"), httpthrottle.WithPolicyName("a\tb"), httpthrottle.WithLogger(nil)} {
		if _, err := httpthrottle.NewMiddleware(limiter, opt); !errors.Is(err, httpthrottle.ErrInvalidOption) {
			t.Errorf("option %v: %v", opt, err)
		}
	}
}

func tcName(p throttle.Policy) string {
	switch p.(type) {
	case throttle.FixedWindow:
		return "FixedWindow"
	case throttle.SlidingLog:
		return "SlidingLog"
	}
	return "GCRA"
}

func itoa(n int) string { return strconv.Itoa(n) }
