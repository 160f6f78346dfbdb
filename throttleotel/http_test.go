package throttleotel_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/httpthrottle"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// TestTransportTurnsAndBackOffs: a request's span shows its wait for its
// turn, the upstream's 429 and the block it set, and the retry's wait; the
// limiter's sleep is a child span of it.
func TestTransportTurnsAndBackOffs(t *testing.T) {
	tg := redistest.New(t)
	tm := newTelemetry(t)
	var calls atomic.Int32
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 2 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	defer upstream.Close()
	limiter := newLimiter(t, tg, "partner", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1}, throttle.WithObserver(tm.inst))
	transport, err := httpthrottle.NewTransport(limiter, httpthrottle.WithRetries(1), tm.inst.TransportOption())
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: transport}
	var firstAsked, secondAsked time.Time
	for _, name := range []string{"first", "second"} {
		if name == "first" {
			firstAsked = time.Now()
		} else {
			secondAsked = time.Now()
		}
		ctx, span := tm.tracer.Start(context.Background(), name)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, upstream.URL, nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		span.End()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s request: %d", name, resp.StatusCode)
		}
	}

	second := tm.ended("second")[0]
	var got []string
	for _, e := range second.Events() {
		if e.Name == "throttle.decision" {
			continue
		}
		a := attrs(e.Attributes)
		for i, s := range a {
			if strings.HasPrefix(s, "jobthrottle.delay=") {
				a[i] = "jobthrottle.delay=*"
			}
		}
		got = append(got, e.Name+" "+strings.Join(a, " "))
	}
	want := []string{
		"throttle.turn jobthrottle.attempt=0 jobthrottle.delay=* jobthrottle.limiter.name=partner",
		"throttle.backoff http.response.status_code=429 jobthrottle.attempt=0 jobthrottle.delay=* jobthrottle.limiter.name=partner jobthrottle.retrying=true",
		"throttle.turn jobthrottle.attempt=1 jobthrottle.delay=* jobthrottle.limiter.name=partner",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("second request's events:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	evs := second.Events()
	delays := []float64{}
	for _, e := range evs {
		if v, ok := attr(e.Attributes, "jobthrottle.delay"); ok {
			delays = append(delays, v.AsFloat64())
		}
	}
	// The second request's turn came 100 ms after the first's admission,
	// which was after firstAsked: it waited at least what was left of that
	// when it asked (1 ms allowed for the clocks of Redis and this process,
	// read apart); its wait also holds the limiter's round trips and the
	// timer's lateness (0.103 s in all on an idle machine), checked only to
	// be well under the block. The block is the Retry-After's second; the
	// retry waits it out (on the Redis clock: this process's timer may fire
	// early by the clocks' drift, never by 100 ms).
	least := (99*time.Millisecond - secondAsked.Sub(firstAsked)).Seconds()
	if delays[0] < least || delays[0] > 0.5 || delays[1] != 1 || delays[2] < 0.9 {
		t.Errorf("delays %v s: want at least %.3f and well under 1, exactly 1, and at least 0.9", delays, least)
	}
	waits := tm.ended("throttle.wait")
	var under int
	for _, w := range waits {
		if w.Parent().SpanID() == second.SpanContext().SpanID() {
			under++
		}
	}
	if under != 2 {
		t.Errorf("%d of %d throttle.wait spans under the second request, want its two sleeps", under, len(waits))
	}
}

// TestMiddlewareAnswers: the span of an inbound request shows the
// Middleware's answer.
func TestMiddlewareAnswers(t *testing.T) {
	tg := redistest.New(t)
	tm := newTelemetry(t)
	limiter := newLimiter(t, tg, "inbound", throttle.SlidingLog{Limit: 1, Window: time.Hour})
	m, err := httpthrottle.NewMiddleware(limiter, tm.inst.MiddlewareOption())
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }))
	for range 2 {
		ctx, span := tm.tracer.Start(context.Background(), "inbound")
		req := httptest.NewRequestWithContext(ctx, http.MethodGet, "http://api.example/", nil)
		req.RemoteAddr = "203.0.113.7:51000"
		h.ServeHTTP(httptest.NewRecorder(), req)
		span.End()
	}
	spans := tm.ended("inbound")
	first := strings.Join(attrs(events(spans[0], "throttle.request")[0].Attributes), " ")
	if first != "jobthrottle.http.event=admitted jobthrottle.limiter.name=inbound" {
		t.Errorf("first request's event: %s", first)
	}
	e := events(spans[1], "throttle.request")[0]
	if v, _ := attr(e.Attributes, "http.response.status_code"); v.AsInt64() != 429 {
		t.Errorf("second request's event %v, want a 429", attrs(e.Attributes))
	}
	if v, _ := attr(e.Attributes, "jobthrottle.retry_after"); v.AsFloat64() <= 0 || v.AsFloat64() > 3600 {
		t.Errorf("second request's retry_after %v, want up to an hour (one a sliding hour)", v.AsFloat64())
	}
}
