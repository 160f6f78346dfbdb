package throttle_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// algorithm is one entry of the conformance suite: a policy, its reference
// model, and what it promises.
type algorithm struct {
	name   string
	policy throttle.Policy
	model  func() model
	// exactRetry: at now+RetryAfter the same request is admitted and a
	// millisecond earlier it is not. Not promised by the sliding-window
	// approximation, whose estimate is not the true count.
	exactRetry bool
}

// algorithms returns every algorithm with capacity 5 and a rate whose
// interval (333,333⅓ µs) is not a whole number of microseconds, so the
// scripts' fractional arithmetic is exercised.
func algorithms() []algorithm {
	return algorithmsWith(5, time.Second, throttle.Rate{N: 3, Per: time.Second})
}

// algorithmsWith returns every algorithm with the given capacity, window and
// rate.
func algorithmsWith(capacity int, window time.Duration, rate throttle.Rate) []algorithm {
	return []algorithm{
		{"FixedWindow", throttle.FixedWindow{Limit: capacity, Window: window},
			func() model { return newFixedWindowModel(capacity, window) }, true},
		{"SlidingLog", throttle.SlidingLog{Limit: capacity, Window: window},
			func() model { return newSlidingLogModel(capacity, window) }, true},
		{"SlidingWindow", throttle.SlidingWindow{Limit: capacity, Window: window},
			func() model { return newSlidingWindowModel(capacity, window) }, false},
		{"TokenBucket", throttle.TokenBucket{Rate: rate, Burst: capacity},
			func() model { return newTokenBucketModel(rate.N, rate.Per, capacity) }, true},
		{"LeakyBucket", throttle.LeakyBucket{Rate: rate, Capacity: capacity},
			func() model { return newLeakyBucketModel(rate.N, rate.Per, capacity) }, true},
		{"GCRA", throttle.GCRA{Rate: rate, Burst: capacity},
			func() model { return newGCRAModel(rate.N, rate.Per, capacity) }, true},
	}
}

// newLimiter builds a Limiter on the target with the target's key prefix.
func newLimiter(t testing.TB, tg *redistest.Target, p throttle.Policy, opts ...throttle.Option) *throttle.Limiter {
	t.Helper()
	return newNamedLimiter(t, tg, policyName(p), p, opts...)
}

// policyName names a test's limiter by its policy (its short form, a
// valid name): limiters of one policy in a test share their state, and
// limiters of different policies do not.
func policyName(p throttle.Policy) string {
	if p == nil {
		return "nil"
	}
	return fmt.Sprint(p)
}

// newNamedLimiter returns the Limiter called name, of p on the target,
// under its prefix; it fails the test on an error.
func newNamedLimiter(t testing.TB, tg *redistest.Target, name string, p throttle.Policy, opts ...throttle.Option) *throttle.Limiter {
	t.Helper()
	l, err := throttle.New(tg.Client, name, p, append([]throttle.Option{throttle.WithPrefix(tg.Prefix)}, opts...)...)
	if err != nil {
		t.Fatalf("New(%#v): %v", p, err)
	}
	return l
}

// allowN calls AllowN and fails the test on an error.
func allowN(t testing.TB, l *throttle.Limiter, key string, n int) throttle.Result {
	t.Helper()
	r, err := l.AllowN(context.Background(), key, n)
	if err != nil {
		t.Fatalf("AllowN(%q, %d): %v", key, n, err)
	}
	return r
}

// peek calls Peek and fails the test on an error.
func peek(t testing.TB, l *throttle.Limiter, key string) throttle.Result {
	t.Helper()
	r, err := l.Peek(context.Background(), key)
	if err != nil {
		t.Fatalf("Peek(%q): %v", key, err)
	}
	return r
}

// asDecision converts a Result to the models' terms.
func asDecision(r throttle.Result) decision {
	return decision{r.Allowed, int64(r.Remaining), r.RetryAfter.Microseconds(), r.ResetAfter.Microseconds()}
}

// checkAgainstModel runs one request through the limiter and the model at
// the server time the script reports, and fails the test if they differ.
func checkAgainstModel(t testing.TB, l *throttle.Limiter, m model, key string, n int, take bool, step string) throttle.Result {
	t.Helper()
	var r throttle.Result
	if take {
		r = allowN(t, l, key, n)
	} else {
		r = peek(t, l, key)
	}
	got := asDecision(r)
	want := m.decide(throttle.ServerTime(r), int64(n), take)
	if got != want {
		t.Fatalf("%s: take=%v n=%d at %d µs: script %+v, model %+v", step, take, n, throttle.ServerTime(r), got, want)
	}
	return r
}

// checkTTLs fails the test if any key under the target's prefix has no
// expiry.
func checkTTLs(t testing.TB, tg *redistest.Target) {
	t.Helper()
	for _, k := range tg.Keys(t) {
		ttl, err := tg.Client.PTTL(context.Background(), k).Result()
		if err != nil {
			t.Fatalf("PTTL %s: %v", k, err)
		}
		// go-redis reports "no expiry" as -1 and "no key" as -2 (one that
		// expired since the scan); 0 is a key expiring this very
		// millisecond.
		if ttl == -1 {
			t.Fatalf("key %s has no expiry (PTTL %d)", k, ttl)
		}
	}
}

func describe(p throttle.Policy) string { return fmt.Sprintf("%#v", p) }

func itoa(i int) string { return fmt.Sprint(i) }
