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

func (r *recorder) ObserveDecision(d throttle.Decision) {
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
