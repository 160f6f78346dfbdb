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
		l, err := throttle.New(c, "l", throttle.FixedWindow{Limit: 3, Window: redistest.FarWindow}, append(opts, throttle.WithPrefix(prefix))...)
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
	if _, err := throttle.New(tg.Client, "limiter", throttle.GCRA{Rate: throttle.PerSecond(1), Burst: 1}, throttle.WithDenyCache(-1)); !errors.Is(err, throttle.ErrInvalidOption) {
		t.Fatalf("negative size: %v", err)
	}
}

// TestACancelInThisProcessClearsItsDenials: a reservation cancelled in
// this process gives back units that a remembered refusal of the key would
// hide: the cache forgets the key, and the next decision goes to Redis.
func TestACancelInThisProcessClearsItsDenials(t *testing.T) {
	tg := redistest.Embedded(t)
	l := newLimiter(t, tg, throttle.FixedWindow{Limit: 1, Window: redistest.FarWindow}, throttle.WithDenyCache(10))
	ctx := context.Background()
	res, err := l.Reserve(ctx, "k", 1, 0)
	if err != nil || !res.OK {
		t.Fatalf("Reserve: %+v, %v", res, err)
	}
	if r := allowN(t, l, "k", 1); r.Allowed {
		t.Fatalf("the window's one unit is reserved: %+v", r)
	}
	if err := res.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	if r := allowN(t, l, "k", 1); !r.Allowed || r.Cached {
		t.Fatalf("after the reservation was cancelled here: %+v; want admitted, by Redis", r)
	}
}

// TestAllowManyChecksEveryRequestFirst: a batch with an invalid request
// decides nothing, on the limiters that decide its requests one at a time
// (a Quota, leased shares) as on the others: the valid request before it
// takes no unit.
func TestAllowManyChecksEveryRequestFirst(t *testing.T) {
	for _, c := range []struct {
		name   string
		policy throttle.Policy
		opts   []throttle.Option
	}{
		{"quota", throttle.Quota{Limit: 10, Period: throttle.Day}, nil},
		{"leased shares", throttle.GCRA{Rate: throttle.PerMinute(10), Burst: 10}, []throttle.Option{throttle.WithLeasedShares(0)}},
		{"gcra", throttle.GCRA{Rate: throttle.PerMinute(10), Burst: 10}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			tg := redistest.Embedded(t)
			l := newLimiter(t, tg, c.policy, c.opts...)
			ctx := context.Background()
			if _, err := l.AllowMany(ctx, []throttle.Request{{Key: "a", N: 1}, {Key: "b", N: 0}}); !errors.Is(err, throttle.ErrInvalidN) {
				t.Fatalf("a batch with n = 0 in it: %v; want ErrInvalidN", err)
			}
			if err := l.Close(ctx); err != nil { // a share held is given back
				t.Fatal(err)
			}
			if r := peek(t, newLimiter(t, tg, c.policy), "a"); r.Remaining != 10 {
				t.Fatalf("a's units after the batch failed: %+v; want all 10 left", r)
			}
		})
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
			batched, err := throttle.New(c, "batched", a.policy, throttle.WithPrefix(tg.Prefix+"b:"))
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

// TestDenyCacheForgetsAChangedPolicy: a key refused under one policy is
// judged again by Redis as soon as another policy is in force for it: a
// stored raise reaches a key in the deny cache at once (it stayed refused
// from the cache until the old RetryAfter ended), through Allow and
// AllowMany, for a rate (GCRA 3/min raised to 60/min) and for a daily
// quota (3 raised to 10); a stored cut is applied as quickly. A block
// holds whatever the policy.
func TestDenyCacheForgetsAChangedPolicy(t *testing.T) {
	cases := []struct {
		name       string
		code, next throttle.Policy
		used       int
	}{
		{"gcra raised", throttle.GCRA{Rate: throttle.PerMinute(3), Burst: 3}, throttle.GCRA{Rate: throttle.PerMinute(60), Burst: 60}, 3},
		{"quota raised", throttle.Quota{Limit: 3, Period: throttle.Day}, throttle.Quota{Limit: 10, Period: throttle.Day}, 3},
		{"window raised", throttle.FixedWindow{Limit: 3, Window: time.Hour}, throttle.FixedWindow{Limit: 5, Window: time.Hour}, 3},
	}
	for _, c := range cases {
		for _, many := range []bool{false, true} {
			name := c.name
			if many {
				name += ", AllowMany"
			}
			t.Run(name, func(t *testing.T) {
				tg := redistest.Embedded(t)
				clock := tg.Clock(t)
				clock.Set(time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC))
				ctx := context.Background()
				l := newNamedLimiter(t, tg, "partner", c.code, throttle.WithLivePolicies(), throttle.WithDenyCache(100))
				allow := func() throttle.Result {
					t.Helper()
					if !many {
						return allowN(t, l, "tenant", 1)
					}
					rs, err := l.AllowMany(ctx, []throttle.Request{{Key: "tenant", N: 1}})
					if err != nil {
						t.Fatal(err)
					}
					return rs[0]
				}
				for range c.used {
					if r := allow(); !r.Allowed {
						t.Fatalf("refused within the limit: %+v", r)
					}
				}
				for range 2 {
					allow()
				}
				if r := allow(); r.Allowed || !r.Cached {
					t.Fatalf("a refusal repeated: %+v; want it answered from the cache", r)
				}
				store, err := throttle.NewPolicyStore(tg.Client, tg.Prefix)
				if err != nil {
					t.Fatal(err)
				}
				if err := store.Set(ctx, "partner", c.next); err != nil {
					t.Fatal(err)
				}
				throttle.ForgetPolicyRead(l) // as a second after the change
				r := allow()
				if !r.Allowed || r.Cached {
					t.Fatalf("the first decision under %s: %+v; want admitted by Redis", c.next, r)
				}
				if d := decisionPolicy(t, l); d != c.next.String() {
					t.Fatalf("decided under %s, want %s", d, c.next)
				}

				// A cut reaches a key refused under the raise too, and a
				// block outlives a change.
				for allow().Allowed {
				}
				if err := store.Set(ctx, "partner", c.code); err != nil {
					t.Fatal(err)
				}
				throttle.ForgetPolicyRead(l)
				if r := allow(); r.Allowed || r.Cached {
					t.Fatalf("the first decision after the cut: %+v; want refused by Redis", r)
				}
				if err := l.BlockFor(ctx, "tenant", time.Hour); err != nil {
					t.Fatal(err)
				}
				if err := store.Set(ctx, "partner", c.next); err != nil {
					t.Fatal(err)
				}
				throttle.ForgetPolicyRead(l)
				if r := allow(); r.Allowed {
					t.Fatalf("admitted while blocked: %+v", r)
				}
			})
		}
	}
}

// decisionPolicy returns the policy in force for the key "tenant" of l.
func decisionPolicy(t *testing.T, l *throttle.Limiter) string {
	t.Helper()
	p, err := l.PolicyFor(context.Background(), "tenant")
	if err != nil {
		t.Fatal(err)
	}
	return p.String()
}
