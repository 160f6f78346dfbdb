package throttle_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// recorder is an Observer keeping every decision.
type recorder struct {
	mu        sync.Mutex
	decisions []throttle.Decision
}

func (r *recorder) ObserveDecision(_ context.Context, d throttle.Decision) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.decisions = append(r.decisions, d)
}

// summary returns "op/outcome" of each decision, in order.
func (r *recorder) summary() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, d := range r.decisions {
		out = append(out, string(d.Op)+"/"+d.Outcome.String())
	}
	return out
}

func TestObserverSeesEveryDecision(t *testing.T) {
	tg := redistest.New(t)
	ctx := context.Background()
	rec := &recorder{}
	l := newNamedLimiter(t, tg, "partner", throttle.GCRA{Rate: throttle.PerHour(1), Burst: 2}, throttle.WithObserver(rec))
	allowN(t, l, "a", 1)
	allowN(t, l, "a", 1)
	allowN(t, l, "a", 1)
	peek(t, l, "a")
	if _, err := l.Allow(ctx, ""); !errors.Is(err, throttle.ErrInvalidKey) {
		t.Fatalf("empty key: %v", err)
	}
	if res, err := l.Reserve(ctx, "b", 1, time.Hour); err != nil || !res.OK {
		t.Fatalf("Reserve: %+v, %v", res, err)
	}
	if _, err := l.AllowMany(ctx, []throttle.Request{{Key: "c", N: 1}, {Key: "a", N: 1}}); err != nil {
		t.Fatal(err)
	}
	want := []string{"allow/admitted", "allow/admitted", "allow/throttled", "peek/throttled", "allow/error",
		"reserve/admitted", "allow/admitted", "allow/throttled"}
	if got := rec.summary(); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("decisions:\n got %v\nwant %v", got, want)
	}
	for _, d := range rec.decisions {
		if d.Limiter != "partner" || d.Latency <= 0 || d.RedisFailed() {
			t.Fatalf("decision %+v: want limiter partner, a latency, no Redis failure", d)
		}
	}

	conc, err := throttle.NewConcurrencyLimiter(tg.Client, "conc", throttle.Concurrency{Limit: 1, Lease: time.Minute},
		throttle.WithPrefix(tg.Prefix), throttle.WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	lease, _, err := conc.Acquire(ctx, "x")
	if err != nil || lease == nil {
		t.Fatalf("Acquire: %v", err)
	}
	defer lease.Release(ctx)
	if _, r, err := conc.Acquire(ctx, "x"); err != nil || r.Allowed {
		t.Fatalf("second Acquire: %+v, %v", r, err)
	}
	last := rec.decisions[len(rec.decisions)-1]
	if last.Op != throttle.OpAcquire || last.Outcome != throttle.Throttled || last.Limiter != "conc" {
		t.Fatalf("Acquire observed as %+v", last)
	}
}

func TestOutagesAreObservedAndLoggedSparingly(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: redistest.DeadAddr(t), MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { client.Close() })
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	ctx := context.Background()
	for _, failure := range []throttle.FailurePolicy{throttle.FailClosed, throttle.FailOpen} {
		logs.Reset()
		rec := &recorder{}
		l, err := throttle.New(client, "l", throttle.FixedWindow{Limit: 1, Window: time.Second},
			throttle.WithFailurePolicy(failure), throttle.WithObserver(rec), throttle.WithLogger(logger))
		if err != nil {
			t.Fatal(err)
		}
		for range 20 {
			_, _ = l.Allow(ctx, "k")
		}
		want := throttle.Errored
		if failure == throttle.FailOpen {
			want = throttle.Degraded
		}
		for _, d := range rec.decisions {
			if d.Outcome != want || !d.RedisFailed() || d.Err == nil || d.Limiter != "l" {
				t.Fatalf("%s: decision %+v, want %s with its Redis error", failure, d, want)
			}
		}
		if len(rec.decisions) != 20 {
			t.Fatalf("%s: %d decisions observed, want 20", failure, len(rec.decisions))
		}
		// Twenty failures inside outageLogEvery make one record.
		if n := strings.Count(logs.String(), "level=WARN"); n != 1 {
			t.Fatalf("%s: %d log records for 20 failures, want 1:\n%s", failure, n, logs.String())
		}
		if !strings.Contains(logs.String(), "limiter=l ") || !strings.Contains(logs.String(), "outcome="+want.String()) {
			t.Fatalf("%s: log record lacks the limiter or outcome:\n%s", failure, logs.String())
		}
	}
}

func TestObserverOptionsRejectBadInput(t *testing.T) {
	tg := redistest.Embedded(t)
	p := throttle.GCRA{Rate: throttle.PerSecond(1), Burst: 1}
	for name, opt := range map[string]throttle.Option{
		"nil observer": throttle.WithObserver(nil),
	} {
		if _, err := throttle.New(tg.Client, "limiter", p, opt); !errors.Is(err, throttle.ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalidOption", name, err)
		}
	}
	if _, err := throttle.New(tg.Client, "limiter", p, throttle.WithLogger(nil)); err != nil {
		t.Errorf("WithLogger(nil) discards, want no error: %v", err)
	}
}

// ctxMark marks the context a test passes to a limiter, to find it again
// in what the observer was given.
type ctxMark struct{}

func TestObserverSeesWaitsAndTheCallersContext(t *testing.T) {
	tg := redistest.New(t)
	ctx := context.WithValue(context.Background(), ctxMark{}, "caller")
	var mu sync.Mutex
	var got []throttle.Decision
	obs := throttle.ObserverFunc(func(c context.Context, d throttle.Decision) {
		if c.Value(ctxMark{}) != "caller" {
			t.Errorf("%s decision observed without the caller's context", d.Op)
		}
		mu.Lock()
		defer mu.Unlock()
		got = append(got, d)
	})
	// Policies under which a second Wait right after a first one must
	// sleep, whenever it starts: not a window aligned to the clock, which
	// may turn between the two.
	cases := []struct {
		name   string
		policy throttle.Policy
	}{
		{"gcra", throttle.GCRA{Rate: throttle.PerSecond(4), Burst: 1}},
		{"sliding log", throttle.SlidingLog{Limit: 1, Window: 300 * time.Millisecond}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			got = nil
			mu.Unlock()
			l := newNamedLimiter(t, tg, "w-"+strings.ReplaceAll(tc.name, " ", "-"), tc.policy, throttle.WithObserver(obs))
			if err := l.Wait(ctx, "k"); err != nil {
				t.Fatal(err)
			}
			before := time.Now()
			if err := l.Wait(ctx, "k"); err != nil {
				t.Fatal(err)
			}
			took := time.Since(before)
			cancelled, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
			defer cancel()
			if err := l.Wait(cancelled, "k"); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("third Wait: %v, want a deadline error", err)
			}
			mu.Lock()
			defer mu.Unlock()
			var waits []throttle.Decision
			for _, d := range got {
				switch {
				case d.Op == throttle.OpWait:
					waits = append(waits, d)
				case d.Outcome == throttle.Throttled && d.RetryAfter <= 0:
					t.Errorf("throttled %s decision without its RetryAfter: %+v", d.Op, d)
				case d.Outcome != throttle.Throttled && d.RetryAfter != 0:
					t.Errorf("%s %s decision with a RetryAfter: %+v", d.Op, d.Outcome, d)
				}
			}
			// The first Wait did not sleep; the second slept and was
			// admitted; the third either failed at once (its deadline too
			// near: no sleep) or slept until its context ended.
			if len(waits) < 1 || len(waits) > 2 {
				t.Fatalf("wait reports %+v, want the second Wait's and perhaps the third's", waits)
			}
			w := waits[0]
			if w.Outcome != throttle.Admitted || w.Limiter != l.Name() || w.Key != "k" || w.N != 1 || w.Latency <= 0 || w.Latency > took {
				t.Fatalf("second Wait reported %+v; want admitted after sleeping at most the call's %s", w, took)
			}
			if len(waits) == 2 && (waits[1].Outcome != throttle.Errored || !errors.Is(waits[1].Err, context.DeadlineExceeded)) {
				t.Fatalf("third Wait reported %+v; want an error wrapping its deadline", waits[1])
			}
		})
	}
}
