package throttle_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// TestDenyCacheCutsRedisCalls: a flood of checks on an over-limit key goes
// to Redis once per wait with the deny cache, at least 50 times less often
// than without, and admits exactly the same: nothing more.
func TestDenyCacheCutsRedisCalls(t *testing.T) {
	tg := redistest.New(t)
	flood := func(opts ...throttle.Option) (admitted, cached int, calls int) {
		counter := &commandCounter{count: map[string]int{}}
		c := tg.NewClient(t)
		c.AddHook(counter)
		prefix := tg.Prefix + itoa(len(opts)) + ":"
		l, err := throttle.New(c, throttle.FixedWindow{Limit: 3, Window: time.Hour}, append(opts, throttle.WithPrefix(prefix))...)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var a, ca atomic.Int32
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 1000 {
					r, err := l.Allow(context.Background(), "hot")
					if err != nil {
						t.Error(err)
						return
					}
					if r.Allowed {
						a.Add(1)
					}
					if r.Cached {
						ca.Add(1)
						if r.Allowed || r.RetryAfter <= 0 || r.Remaining != 0 {
							t.Errorf("a cached answer: %+v", r)
						}
					}
				}
			}()
		}
		wg.Wait()
		return int(a.Load()), int(ca.Load()), counter.count["evalsha"] + counter.count["eval"]
	}
	plainAdmitted, _, plainCalls := flood()
	cachedAdmitted, cachedAnswers, cachedCalls := flood(throttle.WithDenyCache(100))
	if plainAdmitted != 3 || cachedAdmitted != 3 {
		t.Fatalf("admitted %d without the cache and %d with it; the limit is 3", plainAdmitted, cachedAdmitted)
	}
	if plainCalls < 50*cachedCalls {
		t.Fatalf("8000 checks: %d script calls without the cache, %d with it; want at least 50× fewer", plainCalls, cachedCalls)
	}
	if cachedAnswers < 7900 {
		t.Fatalf("only %d of 8000 checks answered locally", cachedAnswers)
	}
	t.Logf("8000 checks on an over-limit key: %d script calls without the deny cache, %d with it (%.0f×)", plainCalls, cachedCalls, float64(plainCalls)/float64(cachedCalls))
}

// TestDenyCacheDeniesOnlyWhatRedisDenied: smaller requests than the one
// rejected still go to Redis; the cache lets go when the wait is over; a
// Reset forgets it. Redis's clock is driven (a window turning between two
// calls would refill it); the cache's own expiry runs on this process's.
func TestDenyCacheDeniesOnlyWhatRedisDenied(t *testing.T) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	clock.Set(time.Unix(1_800_000_000, 0)) // a window's start
	l := newLimiter(t, tg, throttle.FixedWindow{Limit: 4, Window: 300 * time.Millisecond}, throttle.WithDenyCache(10))
	ctx := context.Background()
	allowN(t, l, "k", 2)
	big := allowN(t, l, "k", 3) // 2 left: rejected, and remembered
	if big.Allowed || big.Cached {
		t.Fatalf("3 of 2 left: %+v", big)
	}
	if again := allowN(t, l, "k", 3); again.Allowed || !again.Cached {
		t.Fatalf("3 again: %+v; want the cached rejection", again)
	}
	if small := allowN(t, l, "k", 2); !small.Allowed || small.Cached {
		t.Fatalf("2 of 2 left: %+v; a smaller request must reach Redis", small)
	}
	none := allowN(t, l, "k", 1)
	if none.Allowed {
		t.Fatalf("the window is spent: %+v", none)
	}
	clock.Advance(none.RetryAfter)
	time.Sleep(none.RetryAfter)
	if after := allowN(t, l, "k", 1); !after.Allowed {
		t.Fatalf("after the wait: %+v; the cache must let go", after)
	}
	allowN(t, l, "k", 3)
	allowN(t, l, "k", 1) // rejected and remembered
	if err := l.Reset(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if r := allowN(t, l, "k", 1); !r.Allowed {
		t.Fatalf("after Reset: %+v", r)
	}
	if _, err := throttle.New(tg.Client, throttle.GCRA{Rate: throttle.PerSecond(1), Burst: 1}, throttle.WithDenyCache(-1)); !errors.Is(err, throttle.ErrInvalidOption) {
		t.Fatalf("negative size: %v", err)
	}
}

// TestAllowManyMatchesOneByOne: a batch decides exactly what the same
// requests one by one would, in one round trip.
func TestAllowManyMatchesOneByOne(t *testing.T) {
	for _, a := range algorithms() {
		t.Run(a.name, func(t *testing.T) {
			tg := redistest.Embedded(t)
			tg.Clock(t)
			counter := &commandCounter{count: map[string]int{}}
			c := tg.NewClient(t)
			c.AddHook(counter)
			batched, err := throttle.New(c, a.policy, throttle.WithPrefix(tg.Prefix+"b:"))
			if err != nil {
				t.Fatal(err)
			}
			single := newLimiter(t, tg, a.policy)
			var reqs []throttle.Request
			for i := range 40 {
				reqs = append(reqs, throttle.Request{Key: "k" + itoa(i%3), N: 1 + i%2})
			}
			results, err := batched.AllowMany(context.Background(), reqs)
			if err != nil {
				t.Fatal(err)
			}
			for i, req := range reqs {
				want := allowN(t, single, req.Key, req.N)
				if asDecision(results[i]) != asDecision(want) {
					t.Fatalf("request %d %+v: batch %+v, one by one %+v", i, req, results[i], want)
				}
			}
			// One pipeline by SHA, and one more with the script's text, which
			// this fresh Redis has not seen; EVAL leaves it cached.
			if n := counter.pipelines.Load(); n != 2 || counter.count["script"] != 0 {
				t.Fatalf("%d script pipelines and %d SCRIPT LOADs for one batch", n, counter.count["script"])
			}
			if _, err := batched.AllowMany(context.Background(), reqs[:5]); err != nil || counter.pipelines.Load() != 3 {
				t.Fatalf("a second batch: %v, %d pipelines in all; want one more", err, counter.pipelines.Load())
			}
			if _, err := batched.AllowMany(context.Background(), []throttle.Request{{Key: "", N: 1}}); !errors.Is(err, throttle.ErrInvalidKey) {
				t.Fatalf("a bad request: %v", err)
			}
		})
	}
}

var _ redis.Hook = (*commandCounter)(nil)
