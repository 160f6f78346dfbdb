package throttle_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

func TestNewRejectsBadPolicies(t *testing.T) {
	tg := redistest.Embedded(t)
	second := throttle.PerSecond(1)
	for _, tc := range []struct {
		policy throttle.Policy
		says   string // part of the message
	}{
		{nil, "nil policy"},
		{throttle.FixedWindow{Limit: 0, Window: time.Second}, "FixedWindow.Limit must be at least 1, got 0"},
		{throttle.FixedWindow{Limit: -3, Window: time.Second}, "Limit"},
		{throttle.FixedWindow{Limit: 1, Window: 0}, "FixedWindow.Window must be at least 1ms, got 0s"},
		{throttle.FixedWindow{Limit: 1, Window: -time.Second}, "Window"},
		{throttle.SlidingLog{Limit: 1, Window: 999 * time.Microsecond}, "SlidingLog.Window must be at least 1ms"},
		{throttle.SlidingLog{Limit: 1, Window: 20 * 365 * 24 * time.Hour}, "at most"},
		{throttle.SlidingWindow{Limit: 1, Window: time.Millisecond + time.Nanosecond}, "whole number of microseconds"},
		{throttle.SlidingWindow{Limit: 1 << 40, Window: time.Hour}, "too large"},
		{throttle.TokenBucket{Rate: throttle.Rate{}, Burst: 1}, "TokenBucket.Rate.N must be at least 1, got 0"},
		{throttle.TokenBucket{Rate: throttle.Rate{N: 1, Per: 0}, Burst: 1}, "TokenBucket.Rate.Per must be at least 1µs"},
		{throttle.TokenBucket{Rate: throttle.Rate{N: 1, Per: -time.Second}, Burst: 1}, "Rate.Per"},
		{throttle.TokenBucket{Rate: second, Burst: 0}, "TokenBucket.Burst must be at least 1, got 0"},
		{throttle.LeakyBucket{Rate: throttle.Rate{N: -1, Per: time.Second}, Capacity: 1}, "LeakyBucket.Rate.N"},
		{throttle.LeakyBucket{Rate: second, Capacity: -1}, "LeakyBucket.Capacity must be at least 1"},
		{throttle.GCRA{Rate: second, Burst: 0}, "GCRA.Burst must be at least 1"},
		{throttle.GCRA{Rate: throttle.PerHour(1), Burst: 1 << 30}, "too large"},
		{throttle.GCRA{Rate: throttle.Rate{N: 1, Per: 1500 * time.Nanosecond}, Burst: 1}, "whole number of microseconds"},
		// Limits past what the scripts count exactly, or loop over.
		{throttle.FixedWindow{Limit: 1<<53 + 1, Window: time.Second}, "FixedWindow.Limit must be at most 2^50"},
		{throttle.FixedWindow{Limit: 1<<50 + 1, Window: time.Hour}, "at most 2^50"},
		{throttle.SlidingLog{Limit: 2_000_000, Window: time.Minute}, "SlidingLog.Limit must be at most 10000"},
		{throttle.SlidingLog{Limit: 10_001, Window: time.Minute}, "use SlidingWindow or GCRA"},
	} {
		_, err := throttle.New(tg.Client, "limiter", tc.policy)
		if !errors.Is(err, throttle.ErrInvalidPolicy) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("New(%#v) = %v; want ErrInvalidPolicy saying %q", tc.policy, err, tc.says)
		}
		if tc.policy != nil && !errors.Is(tc.policy.Validate(), throttle.ErrInvalidPolicy) {
			t.Errorf("%#v.Validate() = %v", tc.policy, tc.policy.Validate())
		}
	}
}

// TestANilPointerPolicyIsRefused: a nil pointer to a policy satisfies
// Policy (the methods are the value's); New and PolicyStore.Set refuse it
// with ErrInvalidPolicy, and a plan that returns one leaves the key to the
// limiter's own policy, where each once panicked.
func TestANilPointerPolicyIsRefused(t *testing.T) {
	tg := redistest.Embedded(t)
	ctx := context.Background()
	var none *throttle.GCRA
	if _, err := throttle.New(tg.Client, "limiter", none); !errors.Is(err, throttle.ErrInvalidPolicy) {
		t.Errorf("New with a nil *GCRA: %v; want ErrInvalidPolicy", err)
	}
	store, err := throttle.NewPolicyStore(tg.Client, tg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Set(ctx, "limiter", none); !errors.Is(err, throttle.ErrInvalidPolicy) {
		t.Errorf("PolicyStore.Set with a nil *GCRA: %v; want ErrInvalidPolicy", err)
	}
	l := newLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(1), Burst: 3},
		throttle.WithPlan(func(context.Context, string) throttle.Policy { return none }))
	if r := allowN(t, l, "k", 1); !r.Allowed || r.Limit != 3 {
		t.Errorf("a plan returning a nil *GCRA: %+v; want the limiter's own policy", r)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	tg := redistest.Embedded(t)
	p := throttle.GCRA{Rate: throttle.PerSecond(1), Burst: 1}
	if _, err := throttle.New(nil, "limiter", p); !errors.Is(err, throttle.ErrInvalidOption) {
		t.Errorf("nil client: %v", err)
	}
	// A nil *redis.Client or *redis.ClusterClient in the interface is nil
	// too: an error, not a panic on first use.
	for _, client := range []redis.UniversalClient{(*redis.Client)(nil), (*redis.ClusterClient)(nil), (*redis.Ring)(nil)} {
		if _, err := throttle.New(client, "limiter", p); !errors.Is(err, throttle.ErrInvalidOption) {
			t.Errorf("New(%T(nil)): %v; want ErrInvalidOption", client, err)
		}
		if _, err := throttle.NewConcurrencyLimiter(client, "limiter", throttle.Concurrency{Limit: 1, Lease: time.Second}); !errors.Is(err, throttle.ErrInvalidOption) {
			t.Errorf("NewConcurrencyLimiter(%T(nil)): %v; want ErrInvalidOption", client, err)
		}
	}
	for _, opt := range []throttle.Option{
		nil,
		throttle.WithPrefix("a{b"),
		throttle.WithPrefix("}"),
		throttle.WithTimeout(-time.Second),
		throttle.WithFailurePolicy(throttle.FailurePolicy(7)),
		throttle.WithReplicaAcks(0, time.Second),
		throttle.WithReplicaAcks(1, 0),
	} {
		if _, err := throttle.New(tg.Client, "limiter", p, opt); !errors.Is(err, throttle.ErrInvalidOption) {
			t.Errorf("option %v: %v; want ErrInvalidOption", opt, err)
		}
	}
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	t.Cleanup(func() { ring.Close() })
	if _, err := throttle.New(ring, "limiter", p, throttle.WithReplicaAcks(1, time.Second)); !errors.Is(err, throttle.ErrInvalidOption) {
		t.Errorf("WithReplicaAcks on a Ring: %v; want ErrInvalidOption", err)
	}
}

func TestValidPoliciesAtTheEdges(t *testing.T) {
	tg := redistest.Embedded(t)
	for _, p := range []throttle.Policy{
		throttle.FixedWindow{Limit: 1, Window: time.Millisecond},
		throttle.SlidingLog{Limit: 1, Window: 10 * 365 * 24 * time.Hour},
		throttle.SlidingWindow{Limit: 1_000_000, Window: 24 * time.Hour},
		throttle.TokenBucket{Rate: throttle.Rate{N: 1_000_000_000, Per: time.Second}, Burst: 1},
		throttle.GCRA{Rate: throttle.Rate{N: 1, Per: time.Microsecond}, Burst: 1},
		throttle.GCRA{Rate: throttle.PerHour(1_000_000), Burst: 1_000_000},
		throttle.LeakyBucket{Rate: throttle.Rate{N: 3, Per: 10 * 365 * 24 * time.Hour}, Capacity: 3},
	} {
		l, err := throttle.New(tg.Client, "l", p, throttle.WithPrefix(tg.Prefix))
		if err != nil {
			t.Errorf("New(%#v): %v", p, err)
			continue
		}
		if r := allowN(t, l, "k", 1); !r.Allowed {
			t.Errorf("%#v: first request rejected: %+v", p, r)
		}
	}
}
