package throttle_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// BenchmarkAllow measures one decision, Go side and round trip, for every
// algorithm, on one hot key and on 10,000 keys. Allocations are the Go
// side's; time depends on the Redis (REDIS_ADDR for a real one). The
// comparison with go-redis/redis_rate lives in the bench module.
func BenchmarkAllow(b *testing.B) {
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = "tenant-" + strconv.Itoa(i)
	}
	for _, a := range algorithmsWith(1_000_000, time.Second, throttle.PerSecond(1_000_000)) {
		if a.name == "SlidingLog" {
			// The log holds at most 10,000 entries per key: the same
			// 1,000,000 a second over a window a hundredth as long.
			a.policy = throttle.SlidingLog{Limit: 10_000, Window: 10 * time.Millisecond}
		}
		for _, spread := range []int{1, len(keys)} {
			b.Run(a.name+"/keys-"+strconv.Itoa(spread), func(b *testing.B) {
				tg := redistest.New(b)
				l, err := throttle.New(tg.Client, "l", a.policy, throttle.WithPrefix(tg.Prefix))
				if err != nil {
					b.Fatal(err)
				}
				var next atomic.Int64
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						key := keys[int(next.Add(1))%spread]
						if _, err := l.Allow(context.Background(), key); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}

// BenchmarkDenyCacheHit measures a request the deny cache answers in the
// process, without Redis: the Go side alone.
func BenchmarkDenyCacheHit(b *testing.B) {
	tg := redistest.New(b)
	l, err := throttle.New(tg.Client, "l", throttle.GCRA{Rate: throttle.PerHour(1), Burst: 1},
		throttle.WithPrefix(tg.Prefix), throttle.WithDenyCache(100))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	allowN(b, l, "k", 1)
	allowN(b, l, "k", 1) // rejected by Redis: cached from now on
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if r, err := l.Allow(ctx, "k"); err != nil || !r.Cached {
			b.Fatalf("%+v, %v: not answered from the cache", r, err)
		}
	}
}

// BenchmarkContext measures what watching a caller's context costs a
// decision: GCRA on 10,000 keys with a context that can never end
// (context.Background(): the call runs on the caller's goroutine) and with
// one that can (a request's or a task's: the call runs on a goroutine of
// its own, so that the caller is answered when the context ends, see
// internal/bounded), side by side, at 1 and 8 goroutines.
func BenchmarkContext(b *testing.B) {
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = "tenant-" + strconv.Itoa(i)
	}
	cancellable, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, parallel := range []int{1, 8} {
		for _, c := range []struct {
			name string
			ctx  context.Context
		}{{"background", context.Background()}, {"cancellable", cancellable}} {
			b.Run(c.name+"/goroutines-"+strconv.Itoa(parallel), func(b *testing.B) {
				tg := redistest.New(b)
				l, err := throttle.New(tg.Client, "l", throttle.GCRA{Rate: throttle.PerSecond(1_000_000), Burst: 1_000_000}, throttle.WithPrefix(tg.Prefix))
				if err != nil {
					b.Fatal(err)
				}
				var next atomic.Int64
				b.SetParallelism(parallel)
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if _, err := l.Allow(c.ctx, keys[int(next.Add(1))%len(keys)]); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}

// BenchmarkLeasedAllow measures a decision made in memory under a leased
// share (WithLeasedShares), at 1 and 8 goroutines, once this process holds
// its share, admitted or not (the share follows the demand it measured
// before, far below the benchmark's). It reports the Redis calls per
// decision (renewals, every half lease, off the decision path) and the
// decisions Redis made (a share not renewed in time).
func BenchmarkLeasedAllow(b *testing.B) {
	for _, procs := range []int{1, 8} {
		b.Run("goroutines-"+strconv.Itoa(procs), func(b *testing.B) {
			tg := redistest.New(b)
			client := tg.NewClient(b)
			counter := &commandCounter{count: map[string]int{}}
			client.AddHook(counter)
			l, err := throttle.New(client, "l", throttle.GCRA{Rate: throttle.PerSecond(100_000_000), Burst: 1_000_000},
				throttle.WithPrefix(tg.Prefix), throttle.WithLeasedShares(time.Second))
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close(context.Background())
			ctx := context.Background()
			// Ask until the share is granted (the demand is seen within a
			// lease).
			for deadline := time.Now().Add(5 * time.Second); ; {
				r, err := l.Allow(ctx, "k")
				if err != nil {
					b.Fatal(err)
				}
				if r.Leased {
					break
				}
				if time.Now().After(deadline) {
					b.Fatal("no share granted within 5 s")
				}
				time.Sleep(time.Millisecond)
			}
			counted := func() int {
				counter.mu.Lock()
				defer counter.mu.Unlock()
				n := 0
				for _, c := range counter.count {
					n += c
				}
				return n
			}
			before := counted()
			b.SetParallelism(procs)
			b.ReportAllocs()
			b.ResetTimer()
			var inRedis atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					r, err := l.Allow(ctx, "k")
					if err != nil {
						b.Error(err)
						return
					}
					if !r.Leased {
						inRedis.Add(1)
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(counted()-before)/float64(b.N), "redis-calls/op")
			b.ReportMetric(float64(inRedis.Load())/float64(b.N), "decided-in-redis/op")
		})
	}
}
