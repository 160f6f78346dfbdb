package dashboard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/dashboard/internal/fleet"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
)

// testClock is a Redis clock both the test and the Publisher read.
type testClock struct {
	redis *redistest.Clock
	now   atomic.Int64 // Unix nanoseconds
}

func newTestClock(t *testing.T, r *redistest.Target) *testClock {
	t.Helper()
	c := &testClock{redis: r.Clock(t)}
	c.now.Store(c.redis.Now().UnixNano())
	return c
}

func (c *testClock) Now() time.Time { return time.Unix(0, c.now.Load()) }

func (c *testClock) Advance(d time.Duration) {
	c.redis.Advance(d)
	c.now.Store(c.redis.Now().UnixNano())
}

// logBuffer is a log's output, safe for concurrent use.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// testPublisher returns a Publisher on r's prefix that flushes only when
// told (and at Close, at the test's end), on the clock now (nil: the
// local clock), logging into the returned buffer.
func testPublisher(t *testing.T, r *redistest.Target, now func() time.Time, opts ...PublisherOption) (*Publisher, *logBuffer) {
	t.Helper()
	if now == nil {
		now = time.Now
	}
	log := &logBuffer{}
	opts = append([]PublisherOption{
		WithPublishPrefix(r.Prefix), manualFlush(), WithProcessName("test:1"),
		WithPublisherLogger(slog.New(slog.NewTextHandler(log, nil))),
	}, opts...)
	p, err := newPublisher(r.Client, now, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p, log
}

func mustFlush(t *testing.T, p *Publisher) {
	t.Helper()
	if err := p.flush(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func decision(limiter, key string, op throttle.Op, outcome throttle.Outcome) throttle.Decision {
	return throttle.Decision{Limiter: limiter, Key: key, Op: op, Outcome: outcome, N: 5, Policy: "gcra:10/1s:5", PolicySource: throttle.SourceCode}
}

// series returns the counts of a limiter (key "") or a key, second by
// second from from, over n seconds.
func series(t *testing.T, r *redistest.Target, limiter, key string, from time.Time, n int) []fleet.Counts {
	t.Helper()
	var points []fleet.Point
	var err error
	to := from.Add(time.Duration(n) * time.Second)
	if key == "" {
		points, err = fleet.LimiterSeries(context.Background(), r.Client, r.Prefix, limiter, from, to)
	} else {
		points, err = fleet.KeySeries(context.Background(), r.Client, r.Prefix, limiter, key, from, to)
	}
	if err != nil {
		t.Fatal(err)
	}
	out := make([]fleet.Counts, len(points))
	for i, p := range points {
		out[i] = fleet.Counts{Admitted: p.Admitted, Throttled: p.Throttled, Rescheduled: p.Rescheduled}
	}
	return out
}

func total(counts []fleet.Counts) (sum fleet.Counts) {
	for _, c := range counts {
		sum.Admitted += c.Admitted
		sum.Throttled += c.Throttled
		sum.Rescheduled += c.Rescheduled
	}
	return sum
}

func TestPublisherCountsLandInTheirSecondAndKey(t *testing.T) {
	r := redistest.Embedded(t)
	clock := newTestClock(t, r)
	p, _ := testPublisher(t, r, clock.Now)
	start := clock.Now().Truncate(time.Second)

	steps := []struct {
		observe func()
	}{
		{func() {
			p.ObserveDecision(context.Background(), decision("api", "acme", throttle.OpAllow, throttle.Admitted))
		}},
		{func() {
			p.ObserveDecision(context.Background(), decision("api", "acme", throttle.OpReserve, throttle.Degraded))
		}},
		{func() {
			p.ObserveDecision(context.Background(), decision("api", "acme", throttle.OpAllow, throttle.Throttled))
		}},
		{func() {
			p.ObserveDecision(context.Background(), decision("api", "acme", throttle.OpPeek, throttle.Admitted))
		}}, // not counted
		{func() {
			p.ObserveDecision(context.Background(), decision("api", "acme", throttle.OpAllow, throttle.Errored))
		}}, // not counted
		{func() {
			p.Observe(context.Background(), worker.Event{Kind: worker.Rescheduled, Limiter: "api", Key: "acme"})
		}}, // second 0
		{func() {
			p.Observe(context.Background(), worker.Event{Kind: worker.Admitted, Limiter: "api", Key: "acme"})
		}}, // not counted
		{func() {
			p.Observe(context.Background(), worker.Event{Kind: worker.Rescheduled, Rule: "r", Key: "acme"})
		}}, // no limiter
		{func() { clock.Advance(time.Second) }},
		{func() {
			p.ObserveDecision(context.Background(), decision("api", "zed", throttle.OpAllow, throttle.Throttled))
		}}, // second 1
	}
	for _, s := range steps {
		s.observe()
	}
	mustFlush(t, p)

	want := map[string][]fleet.Counts{
		"":     {{Admitted: 2, Throttled: 1, Rescheduled: 1}, {Throttled: 1}, {}},
		"acme": {{Admitted: 2, Throttled: 1, Rescheduled: 1}, {}, {}},
		"zed":  {{}, {Throttled: 1}, {}},
	}
	for key, w := range want {
		if got := series(t, r, "api", key, start, 3); fmt.Sprint(got) != fmt.Sprint(w) {
			t.Errorf("key %q: %v, want %v", key, got, w)
		}
	}
	limiters, err := fleet.Limiters(context.Background(), r.Client, r.Prefix)
	if err != nil || len(limiters) != 1 || limiters[0].Kind != "rate" || limiters[0].CodePolicy != "gcra:10/1s:5" {
		t.Errorf("Limiters = %+v, %v", limiters, err)
	}
	procs, err := fleet.Processes(context.Background(), r.Client, r.Prefix, start)
	if err != nil || len(procs) != 1 || procs[0].Name != "test:1" {
		t.Errorf("Processes = %+v, %v", procs, err)
	}
}

func TestPublisherNotesKindAndPolicies(t *testing.T) {
	r := redistest.Embedded(t)
	clock := newTestClock(t, r)
	p, _ := testPublisher(t, r, clock.Now)
	p.ObserveDecision(context.Background(), throttle.Decision{Limiter: "slots", Key: "k", Op: throttle.OpAcquire, Outcome: throttle.Admitted})
	p.ObserveDecision(context.Background(), throttle.Decision{Limiter: "conc:jobs", Key: "k", Op: throttle.OpAllow, Outcome: throttle.Admitted})
	p.ObserveDecision(context.Background(), throttle.Decision{Limiter: "api", Key: "vip", Op: throttle.OpAllow, Outcome: throttle.Admitted, Policy: "gcra:100/1s:10", PolicySource: throttle.SourcePlan})
	p.ObserveDecision(context.Background(), throttle.Decision{Limiter: "api", Key: "acme", Op: throttle.OpAllow, Outcome: throttle.Admitted, Policy: "gcra:10/1s:5", PolicySource: throttle.SourceCode})
	p.ObserveDecision(context.Background(), throttle.Decision{Limiter: "api", Key: "bad", Op: throttle.OpAllow, Outcome: throttle.Admitted, Policy: "fw:1/1m", PolicySource: throttle.SourceStoredForKey})
	mustFlush(t, p)
	limiters, err := fleet.Limiters(context.Background(), r.Client, r.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, l := range limiters {
		got[l.Name] = l.Kind + " " + l.CodePolicy
	}
	want := map[string]string{"slots": "concurrency ", "conc:jobs": "concurrency ", "api": "rate gcra:10/1s:5"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("limiters %v, want %v", got, want)
	}
	for key, want := range map[string]string{"vip": "gcra:100/1s:10|plan", "acme": "|", "bad": "fw:1/1m|stored for key"} {
		policy, source, err := fleet.KeyPolicy(context.Background(), r.Client, r.Prefix, "api", key, clock.Now().Add(-time.Minute))
		if err != nil || policy+"|"+source != want {
			t.Errorf("KeyPolicy(%q) = %q, %q, %v; want %q", key, policy, source, err, want)
		}
	}
}

func TestPublisherBoundsKeysAndLimiters(t *testing.T) {
	r := redistest.Embedded(t)
	clock := newTestClock(t, r)
	p, log := testPublisher(t, r, clock.Now, WithKeysPerLimiter(3))
	start := clock.Now().Truncate(time.Second)
	for i := range 10 {
		p.ObserveDecision(context.Background(), decision("api", fmt.Sprintf("k%d", i), throttle.OpAllow, throttle.Throttled))
	}
	for i := range 250 {
		p.ObserveDecision(context.Background(), decision(fmt.Sprintf("lim%03d", i), "k", throttle.OpAllow, throttle.Admitted))
	}
	p.mu.Lock()
	keys, limiters := len(p.live["api"].Callers), len(p.live)
	p.mu.Unlock()
	if keys != 3 || limiters != maxLimiters {
		t.Errorf("holding %d keys and %d limiters, want 3 and %d", keys, limiters, maxLimiters)
	}
	mustFlush(t, p)
	if got := total(series(t, r, "api", "", start, 1)); got.Throttled != 10 {
		t.Errorf("limiter total %+v, want all 10 throttled", got)
	}
	_, ranked, err := fleet.Ranked(context.Background(), r.Client, r.Prefix, "api", fleet.HeldBack, start, "", 0, -1)
	if err != nil || ranked != 3 {
		t.Errorf("%d keys ranked (%v), want 3", ranked, err)
	}
	if !strings.Contains(log.String(), "too many limiters") || !strings.Contains(log.String(), "decisions=51") {
		t.Errorf("no warning of the 51 dropped decisions: %s", log)
	}
	// the next interval counts keys afresh, within the same bound
	clock.Advance(time.Second)
	p.ObserveDecision(context.Background(), decision("api", "k9", throttle.OpAllow, throttle.Throttled))
	mustFlush(t, p)
	if got := total(series(t, r, "api", "k9", start, 2)); got.Throttled != 1 {
		t.Errorf("k9 in the second interval: %+v", got)
	}
}

func TestPublisherKeepsCountsThroughAFailedFlush(t *testing.T) {
	redistest.QuietRedisLog()
	r := redistest.Embedded(t)
	clock := newTestClock(t, r)
	p, log := testPublisher(t, r, clock.Now)
	start := clock.Now().Truncate(time.Second)

	p.ObserveDecision(context.Background(), decision("api", "acme", throttle.OpAllow, throttle.Admitted))
	r.Mini.Close()
	for range 2 {
		if err := p.flush(context.Background()); err == nil {
			t.Fatal("a flush to a stopped Redis succeeded")
		}
	}
	if n := strings.Count(log.String(), "publishing counts to Redis failed"); n != 1 {
		t.Errorf("%d warnings for two failures within a minute, want 1:\n%s", n, log)
	}
	p.ObserveDecision(context.Background(), decision("api", "acme", throttle.OpAllow, throttle.Throttled))
	clock.Advance(time.Second)
	p.ObserveDecision(context.Background(), decision("api", "acme", throttle.OpAllow, throttle.Throttled))
	if err := r.Mini.Restart(); err != nil {
		t.Fatal(err)
	}
	mustFlush(t, p)
	want := []fleet.Counts{{Admitted: 1, Throttled: 1}, {Throttled: 1}}
	if got := series(t, r, "api", "acme", start, 2); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after the outage: %v, want %v", got, want)
	}
}

func TestPublisherDropsCountsOlderThan15Minutes(t *testing.T) {
	redistest.QuietRedisLog()
	r := redistest.Embedded(t)
	clock := newTestClock(t, r)
	p, _ := testPublisher(t, r, clock.Now)
	start := clock.Now().Truncate(time.Second)

	p.ObserveDecision(context.Background(), decision("api", "old", throttle.OpAllow, throttle.Admitted))
	r.Mini.Close()
	clock.Advance(16 * time.Minute)
	if err := p.flush(context.Background()); err == nil {
		t.Fatal("a flush to a stopped Redis succeeded")
	}
	p.mu.Lock()
	held := len(p.live)
	p.mu.Unlock()
	if held != 0 {
		t.Errorf("%d limiters held after 16 minutes, want none", held)
	}
	if err := r.Mini.Restart(); err != nil {
		t.Fatal(err)
	}
	p.ObserveDecision(context.Background(), decision("api", "new", throttle.OpAllow, throttle.Admitted))
	mustFlush(t, p)
	if got := total(series(t, r, "api", "", start, 17*60)); got.Admitted != 1 {
		t.Errorf("counted %+v, want only the new decision", got)
	}
}

func TestPublisherKeysExpire(t *testing.T) {
	r := redistest.Embedded(t)
	clock := newTestClock(t, r)
	p, _ := testPublisher(t, r, clock.Now)
	p.ObserveDecision(context.Background(), decision("api", "acme", throttle.OpAllow, throttle.Throttled))
	mustFlush(t, p)
	if len(r.Keys(t)) == 0 {
		t.Fatal("nothing written")
	}
	clock.Advance(18 * time.Minute)
	for _, k := range r.Keys(t) {
		if !strings.HasSuffix(k, "dash:limiters") && !strings.HasSuffix(k, "dash:procs") {
			t.Errorf("%s outlived 18 minutes", k)
		}
	}
	clock.Advance(24 * time.Hour)
	if keys := r.Keys(t); len(keys) != 0 {
		t.Errorf("left after a day: %q", keys)
	}
}

func TestPublisherCloseFlushes(t *testing.T) {
	r := redistest.New(t)
	p, _ := testPublisher(t, r, nil)
	from := time.Now().Add(-time.Minute)
	p.ObserveDecision(context.Background(), decision("api", "acme", throttle.OpAllow, throttle.Admitted))
	p.Observe(context.Background(), worker.Event{Kind: worker.Rescheduled, Limiter: "api", Key: "acme"})
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	p.ObserveDecision(context.Background(), decision("api", "acme", throttle.OpAllow, throttle.Admitted)) // after Close: dropped
	if err := p.Close(context.Background()); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if got := total(series(t, r, "api", "acme", from, 120)); got != (fleet.Counts{Admitted: 1, Rescheduled: 1}) {
		t.Errorf("after Close: %+v", got)
	}
}

func TestPublishersAggregate(t *testing.T) {
	r := redistest.New(t)
	from := time.Now().Add(-time.Minute)
	for i := range 3 {
		p, _ := testPublisher(t, r, nil, WithProcessName(fmt.Sprintf("proc-%d", i)))
		p.ObserveDecision(context.Background(), decision("api", "acme", throttle.OpAllow, throttle.Throttled))
		p.ObserveDecision(context.Background(), decision("api", "acme", throttle.OpAllow, throttle.Admitted))
		if err := p.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if got := total(series(t, r, "api", "", from, 120)); got != (fleet.Counts{Admitted: 3, Throttled: 3}) {
		t.Errorf("three processes: %+v", got)
	}
	procs, err := fleet.Processes(context.Background(), r.Client, r.Prefix, from)
	if err != nil || len(procs) != 3 {
		t.Errorf("Processes = %+v, %v", procs, err)
	}
}

// TestPublisherConcurrent observes from many goroutines while the
// Publisher flushes every 100ms: every decision is counted once.
func TestPublisherConcurrent(t *testing.T) {
	r := redistest.New(t)
	p, err := NewPublisher(r.Client, WithPublishPrefix(r.Prefix), WithFlushInterval(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	from := time.Now().Add(-time.Minute)
	const goroutines, least = 8, 2000
	var observed, rescheduled atomic.Int64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// observe until three flushes have run in between
			for i := 0; i < least || p.flushes.Load() < 3; i++ {
				key := fmt.Sprintf("k%d", (g*least+i)%50)
				if i%3 == 0 {
					p.Observe(context.Background(), worker.Event{Kind: worker.Rescheduled, Limiter: "api", Key: key})
					rescheduled.Add(1)
				} else {
					p.ObserveDecision(context.Background(), decision("api", key, throttle.OpAllow, throttle.Outcome(i%2)))
				}
				observed.Add(1)
				if i%100 == 0 {
					runtime.Gosched()
				}
			}
		}()
	}
	wg.Wait()
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := observed.Load()
	got := total(series(t, r, "api", "", from, 180))
	if sum := got.Admitted + got.Throttled + got.Rescheduled; sum != want || got.Rescheduled != rescheduled.Load() {
		t.Errorf("counted %+v (%d), want %d decisions, %d rescheduled", got, sum, want, rescheduled.Load())
	}
	rows, _, err := fleet.Ranked(context.Background(), r.Client, r.Prefix, "api", fleet.HeldBack, from, "", 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	var perKey int64
	for _, row := range rows {
		perKey += row.Admitted + row.HeldBack
	}
	// a rescheduled task counts in the series, not in what its key held
	// back: its throttled decision did
	if perKey != want-rescheduled.Load() {
		t.Errorf("the keys' admitted and held back sum to %d, want %d", perKey, want-rescheduled.Load())
	}
}

func TestNewPublisherRefuses(t *testing.T) {
	r := redistest.Embedded(t)
	tests := []struct {
		name string
		opt  PublisherOption
	}{
		{"brace in prefix", WithPublishPrefix("a{b")},
		{"short interval", WithFlushInterval(50 * time.Millisecond)},
		{"long interval", WithFlushInterval(time.Minute)},
		{"no keys", WithKeysPerLimiter(0)},
		{"empty process", WithProcessName("")},
		{"nil option", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := NewPublisher(r.Client, tt.opt); !errors.Is(err, ErrInvalidOption) {
				t.Errorf("err = %v, want ErrInvalidOption", err)
			}
		})
	}
	if _, err := NewPublisher(nil); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("nil client: %v", err)
	}
}

// manualFlush leaves a test's Publisher to flush when the test says
// (p.flush): its interval is an hour, longer than WithFlushInterval allows.
func manualFlush() PublisherOption {
	return publisherOptionFunc(func(c *publisherConfig) error {
		c.interval = time.Hour
		return nil
	})
}
