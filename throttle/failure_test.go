package throttle_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

func TestFailurePolicy(t *testing.T) {
	policy := throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1}
	client := redis.NewClient(&redis.Options{Addr: redistest.DeadAddr(t), MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { client.Close() })
	ctx := context.Background()

	closed, err := throttle.New(client, "closed", policy)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := closed.Allow(ctx, "k"); !errors.Is(err, throttle.ErrUnavailable) || r.Allowed {
		t.Fatalf("fail-closed with Redis down: %+v, %v; want rejected with ErrUnavailable", r, err)
	}
	var opErr *net.OpError
	if _, err := closed.Allow(ctx, "k"); !errors.As(err, &opErr) {
		t.Fatalf("ErrUnavailable does not wrap its cause: %v", err)
	}

	open, err := throttle.New(client, "open", policy, throttle.WithFailurePolicy(throttle.FailOpen))
	if err != nil {
		t.Fatal(err)
	}
	r, err := open.Allow(ctx, "k")
	if err != nil || !r.Allowed || !r.Degraded || r.Limit != 1 {
		t.Fatalf("fail-open with Redis down: %+v, %v; want allowed and degraded", r, err)
	}
	// Peek and Reset report the outage under either policy.
	if _, err := open.Peek(ctx, "k"); !errors.Is(err, throttle.ErrUnavailable) {
		t.Fatalf("Peek with Redis down: %v, want ErrUnavailable", err)
	}
	if err := open.Reset(ctx, "k"); !errors.Is(err, throttle.ErrUnavailable) {
		t.Fatalf("Reset with Redis down: %v, want ErrUnavailable", err)
	}
	// A caller that gave up gets its own context's error, not a degraded
	// admission.
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if r, err := open.Allow(cancelled, "k"); !errors.Is(err, context.Canceled) || errors.Is(err, throttle.ErrUnavailable) || r.Allowed {
		t.Fatalf("cancelled caller under fail-open: %+v, %v; want context.Canceled", r, err)
	}
}

func TestTimeoutBoundsAHangingRedis(t *testing.T) {
	addr := redistest.SilentAddr(t)
	for _, deadlines := range []bool{false, true} {
		// The client would wait 30s on its own.
		client := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 30 * time.Second, MaxRetries: -1, ContextTimeoutEnabled: deadlines})
		t.Cleanup(func() { client.Close() })
		for _, failure := range []throttle.FailurePolicy{throttle.FailClosed, throttle.FailOpen} {
			l, err := throttle.New(client, "l", throttle.FixedWindow{Limit: 1, Window: time.Second},
				throttle.WithTimeout(50*time.Millisecond), throttle.WithFailurePolicy(failure))
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			r, err := l.Allow(context.Background(), "k")
			took := time.Since(start)
			// Generous bound for a busy machine: far below the client's 30s.
			if took > 5*time.Second {
				t.Fatalf("ContextTimeoutEnabled=%v %s: decision took %s with a 50ms timeout", deadlines, failure, took)
			}
			switch failure {
			case throttle.FailClosed:
				if !errors.Is(err, throttle.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("ContextTimeoutEnabled=%v: %v; want ErrUnavailable wrapping DeadlineExceeded", deadlines, err)
				}
			case throttle.FailOpen:
				if err != nil || !r.Allowed || !r.Degraded {
					t.Fatalf("ContextTimeoutEnabled=%v fail-open: %+v, %v", deadlines, r, err)
				}
			}
		}
	}
}

func TestTimeoutDoesNotDisturbAnAnsweringRedis(t *testing.T) {
	tg := redistest.New(t)
	l := newLimiter(t, tg, throttle.FixedWindow{Limit: 2, Window: redistest.FarWindow}, throttle.WithTimeout(5*time.Second))
	for i, want := range []bool{true, true, false} {
		if r := allowN(t, l, "k", 1); r.Allowed != want {
			t.Fatalf("call %d: %+v, want allowed=%v", i, r, want)
		}
	}
}
