package throttle_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// TestExactUnderConcurrency fires 200 concurrent Allow calls on one key with
// limit 25 from two separate connection pools (two "processes"): exactly 25
// are admitted, every rejection carries a RetryAfter, and admission resumes
// once it has passed. One of the two shares round trips between its callers
// (WithCoalescing). Runs on the Redis the environment names.
func TestExactUnderConcurrency(t *testing.T) {
	const limit, callers = 25, 200
	// Periods long enough that nothing refills during the test.
	const long = 24 * time.Hour
	policies := []throttle.Policy{
		throttle.FixedWindow{Limit: limit, Window: long},
		throttle.SlidingLog{Limit: limit, Window: long},
		throttle.SlidingWindow{Limit: limit, Window: long},
		throttle.TokenBucket{Rate: throttle.Rate{N: limit, Per: long}, Burst: limit},
		throttle.LeakyBucket{Rate: throttle.Rate{N: limit, Per: long}, Capacity: limit},
		throttle.GCRA{Rate: throttle.Rate{N: limit, Per: long}, Burst: limit},
	}
	for _, p := range policies {
		t.Run(describe(p), func(t *testing.T) {
			tg := redistest.New(t)
			pools := []redis.UniversalClient{tg.NewClient(t), tg.NewClient(t)}
			var limiters []*throttle.Limiter
			for i, c := range pools {
				l, err := throttle.New(c, "l", p, throttle.WithPrefix(tg.Prefix), throttle.WithCoalescing(32*i))
				if err != nil {
					t.Fatal(err)
				}
				limiters = append(limiters, l)
			}
			awayFromDayBoundary(t, tg.Client)

			results := make([]throttle.Result, callers)
			errs := make([]error, callers)
			var start, done sync.WaitGroup
			start.Add(1)
			for i := range callers {
				done.Add(1)
				go func() {
					defer done.Done()
					start.Wait()
					results[i], errs[i] = limiters[i%2].Allow(context.Background(), "hot")
				}()
			}
			start.Done()
			done.Wait()

			admitted := 0
			var latest throttle.Result
			for i, r := range results {
				if errs[i] != nil {
					t.Fatalf("call %d: %v", i, errs[i])
				}
				if r.Allowed {
					admitted++
					continue
				}
				if r.RetryAfter <= 0 {
					t.Fatalf("call %d rejected without a RetryAfter: %+v", i, r)
				}
				if throttle.ServerTime(r) > throttle.ServerTime(latest) {
					latest = r
				}
			}
			if admitted != limit {
				t.Fatalf("%d of %d concurrent calls admitted, want exactly %d", admitted, callers, limit)
			}
			// Admission resumes once the latest rejection's RetryAfter has
			// passed. Only the embedded Redis's clock can be moved a day on;
			// TestResumesAfterRetryAfter checks the same on a real clock.
			if tg.Mini != nil {
				tg.Mini.SetTime(time.UnixMicro(throttle.ServerTime(latest)).Add(latest.RetryAfter))
				if r, err := limiters[0].Allow(context.Background(), "hot"); err != nil || !r.Allowed {
					t.Fatalf("after RetryAfter %s: %+v, %v; want admitted", latest.RetryAfter, r, err)
				}
			}
		})
	}
}

// awayFromDayBoundary waits, if need be, until the server clock is more
// than ten seconds from a UTC day boundary, so that day-long windows do not
// roll over during the test.
func awayFromDayBoundary(t *testing.T, c redis.UniversalClient) {
	t.Helper()
	now, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	if left := now.Truncate(24 * time.Hour).Add(24 * time.Hour).Sub(now); left < 10*time.Second {
		time.Sleep(left + time.Second)
	}
}

// TestResumesAfterRetryAfter exhausts short-period limits with concurrent
// callers on the environment's Redis, sleeps the RetryAfter it was given,
// and is admitted: RetryAfter holds on a real clock.
func TestResumesAfterRetryAfter(t *testing.T) {
	for _, a := range algorithmsWith(5, 300*time.Millisecond, throttle.Rate{N: 5, Per: 300 * time.Millisecond}) {
		t.Run(a.name, func(t *testing.T) {
			tg := redistest.New(t)
			l := newLimiter(t, tg, a.policy)
			var wg sync.WaitGroup
			for range 20 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if _, err := l.Allow(context.Background(), "k"); err != nil {
						t.Error(err)
					}
				}()
			}
			wg.Wait()
			// Take what refilled while the callers ran, until rejected.
			r := allowN(t, l, "k", 1)
			for i := 0; r.Allowed; i++ {
				if i == 100 {
					t.Fatalf("100 more calls admitted on a limit of 5: %+v", r)
				}
				r = allowN(t, l, "k", 1)
			}
			if r.RetryAfter <= 0 {
				t.Fatalf("rejected without a RetryAfter: %+v", r)
			}
			time.Sleep(r.RetryAfter)
			if again := allowN(t, l, "k", 1); !again.Allowed {
				t.Fatalf("slept RetryAfter %s, still rejected: %+v", r.RetryAfter, again)
			}
		})
	}
}
