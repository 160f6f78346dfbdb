package httpthrottle_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/httpthrottle"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// events keeps what a Transport or a Middleware reported, checking that
// each came with the request's context.
type events struct {
	mu  sync.Mutex
	all []httpthrottle.Event
	bad []string
}

type requestMark struct{}

func (e *events) observe(ctx context.Context, ev httpthrottle.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if ctx.Value(requestMark{}) == nil {
		e.bad = append(e.bad, ev.Kind.String()+" without the request's context")
	}
	e.all = append(e.all, ev)
}

// summary returns "kind/attempt/status/retrying" of each event, in order.
func (e *events) summary(t *testing.T) string {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, b := range e.bad {
		t.Error(b)
	}
	var out []string
	for _, ev := range e.all {
		out = append(out, fmt.Sprintf("%s/%d/%d/%v", ev.Kind, ev.Attempt, ev.Status, ev.Retrying))
	}
	return strings.Join(out, " ")
}

func TestTransportReportsWaitsAndBackOffs(t *testing.T) {
	tg := redistest.New(t)
	u := newUpstream(t)
	u.tooMany = func(n int) (string, bool) { return "1", n == 2 }
	var seen events
	c, limiter := newClient(t, tg, throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1},
		httpthrottle.WithRetries(1), httpthrottle.WithTransportObserver(seen.observe))
	get := func() {
		t.Helper()
		ctx := context.WithValue(context.Background(), requestMark{}, true)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u.URL, nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d, want 200 (after a retry)", resp.StatusCode)
		}
	}
	first := time.Now()
	get() // sent at once
	gap := time.Since(first)
	get() // waits for its turn, 100 ms after the first's, answered 429, blocked 1 s, retried
	want := "waited/0/0/false waited/0/0/false backed_off/0/429/true waited/1/0/false"
	if got := seen.summary(t); got != want {
		t.Fatalf("events %s\nwant   %s", got, want)
	}
	for i, ev := range seen.all {
		if ev.Limiter != limiter.Name() || ev.Key != strings.TrimPrefix(u.URL, "http://") || ev.Err != nil {
			t.Errorf("event %d: %+v; want limiter %q, the host as key, no error", i, ev, limiter.Name())
		}
	}
	// The first was admitted after first, the second asked gap later: its
	// turn was at least 100 ms - gap away (1 ms allowed for the clocks of
	// Redis and this process, read apart).
	if d := seen.all[1].Delay; d < 99*time.Millisecond-gap {
		t.Errorf("second request waited %s for its turn, asking %s after the first; the policy spaces requests 100 ms apart", d, gap)
	}
	if d := seen.all[2].Delay; d != time.Second {
		t.Errorf("back-off of %s, want the Retry-After's 1s", d)
	}
	// The retry waited out the block, on Redis's clock; this process's
	// timer may fire early by the clocks' drift, never by 100 ms.
	if d := seen.all[3].Delay; d < 900*time.Millisecond {
		t.Errorf("retry waited %s, want the 1 s block", d)
	}

	// A wait that cannot end before the request's deadline is reported
	// with its error, and the request is not sent.
	seen = events{}
	ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), requestMark{}, true), time.Millisecond)
	defer cancel()
	blocked := u.URL
	if err := limiter.BlockFor(context.Background(), strings.TrimPrefix(blocked, "http://"), time.Minute); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, blocked, nil)
	if _, err := c.Do(req); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("request into a minute's block with a 1 ms deadline: %v", err)
	}
	if got := seen.summary(t); got != "waited/0/0/false" || !errors.Is(seen.all[0].Err, context.DeadlineExceeded) {
		t.Fatalf("events %s (%+v); want one failed wait", got, seen.all)
	}
}

func TestMiddlewareReportsItsAnswers(t *testing.T) {
	tg := redistest.New(t)
	limiter, err := throttle.New(tg.Client, "inbound", throttle.SlidingLog{Limit: 1, Window: time.Hour}, throttle.WithPrefix(tg.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	var seen events
	m, err := httpthrottle.NewMiddleware(limiter, httpthrottle.WithMiddlewareObserver(seen.observe))
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(okHandler())
	for range 2 {
		r := httptestRequest("203.0.113.7:51000")
		h.ServeHTTP(discard{}, r)
	}
	if got := seen.summary(t); got != "admitted/0/0/false rejected/0/429/false" {
		t.Fatalf("events %s", got)
	}
	if d := seen.all[1].Delay; d <= 0 || d > time.Hour {
		t.Errorf("rejection's Retry-After %s, want up to an hour (one a sliding hour)", d)
	}

	for _, tc := range []struct {
		failure throttle.FailurePolicy
		want    string
	}{
		{throttle.FailClosed, "unavailable/0/503/false"},
		{throttle.FailOpen, "degraded/0/0/false"},
	} {
		down, err := throttle.New(deadRedis(t), "inbound", throttle.GCRA{Rate: throttle.PerSecond(5), Burst: 5}, throttle.WithFailurePolicy(tc.failure), throttle.WithLogger(nil))
		if err != nil {
			t.Fatal(err)
		}
		var seen events
		m, _ := httpthrottle.NewMiddleware(down, quiet, httpthrottle.WithMiddlewareObserver(seen.observe))
		m.Handler(okHandler()).ServeHTTP(discard{}, httptestRequest("203.0.113.7:51000"))
		if got := seen.summary(t); got != tc.want {
			t.Errorf("%s with Redis down: events %s, want %s", tc.failure, got, tc.want)
		}
		if tc.failure == throttle.FailClosed && !errors.Is(seen.all[0].Err, throttle.ErrUnavailable) {
			t.Errorf("503's event error %v, want one wrapping ErrUnavailable", seen.all[0].Err)
		}
	}
	if _, err := httpthrottle.NewMiddleware(limiter, httpthrottle.WithMiddlewareObserver(nil)); !errors.Is(err, httpthrottle.ErrInvalidOption) {
		t.Errorf("nil middleware observer: %v", err)
	}
	if _, err := httpthrottle.NewTransport(limiter, httpthrottle.WithTransportObserver(nil)); !errors.Is(err, httpthrottle.ErrInvalidOption) {
		t.Errorf("nil transport observer: %v", err)
	}
}

// httptestRequest is a GET from remote carrying the test's mark.
func httptestRequest(remote string) *http.Request {
	r, _ := http.NewRequestWithContext(context.WithValue(context.Background(), requestMark{}, true), http.MethodGet, "http://api.example/", nil)
	r.RemoteAddr = remote
	return r
}

// discard is a ResponseWriter that keeps nothing.
type discard struct{}

func (discard) Header() http.Header         { return http.Header{} }
func (discard) Write(b []byte) (int, error) { return len(b), nil }
func (discard) WriteHeader(int)             {}
