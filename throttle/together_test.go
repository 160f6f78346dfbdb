package throttle_test

import (
	"context"
	"sync"
	"testing"
	"time"

	workergate "github.com/jobthrottle/jobthrottle/internal/gate"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// TestTogetherIsOneRoundTrip: the first calls of goroutines sharing
// workergate.Together's context go to Redis in one pipeline, each with its
// own answer, whether or not every goroutine makes one, and also when
// Redis has forgotten the scripts (NOSCRIPT: each is loaded and run on its
// own). A later call of the same context goes on its own.
func TestTogetherIsOneRoundTrip(t *testing.T) {
	for _, c := range []struct {
		name     string
		calling  int // goroutines that make a call; one more leaves without
		flush    bool
		wantPipe int32
	}{
		{name: "three calls", calling: 3, wantPipe: 1},
		{name: "two calls, one goroutine without", calling: 2, wantPipe: 1},
		{name: "scripts flushed first", calling: 3, flush: true, wantPipe: 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			tg := redistest.New(t)
			counter := &commandCounter{count: map[string]int{}}
			client := tg.NewClient(t)
			client.AddHook(counter)
			ctx := context.Background()
			window, err := throttle.New(client, "window", throttle.FixedWindow{Limit: 1, Window: redistest.FarWindow}, throttle.WithPrefix(tg.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			meter, err := throttle.New(client, "meter", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 5}, throttle.WithPrefix(tg.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			capLimiter := newConcurrency(t, client, tg.Prefix, throttle.Concurrency{Limit: 1, Lease: time.Minute})
			// Each script known to Redis, then (maybe) forgotten: loaded by
			// limiters of the same policies under other names, on the same
			// caller key, so that on a Cluster the scripts are known on the
			// node that holds "k" (each node has its own script cache).
			warmWindow, err := throttle.New(client, "warm-window", throttle.FixedWindow{Limit: 1, Window: redistest.FarWindow}, throttle.WithPrefix(tg.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			warmMeter, err := throttle.New(client, "warm-meter", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 5}, throttle.WithPrefix(tg.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			warmCap, err := throttle.NewConcurrencyLimiter(client, "warm-cap", throttle.Concurrency{Limit: 1, Lease: time.Minute}, throttle.WithPrefix(tg.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := warmWindow.Allow(ctx, "k"); err != nil {
				t.Fatal(err)
			}
			if _, err := warmMeter.Allow(ctx, "k"); err != nil {
				t.Fatal(err)
			}
			if l, _, err := warmCap.Acquire(ctx, "k"); err != nil || l == nil {
				t.Fatal(l, err)
			}
			if c.flush {
				if err := client.ScriptFlush(ctx).Err(); err != nil {
					t.Fatal(err)
				}
			}
			counter.pipelines.Store(0)
			counter.noscript.Store(0)
			counter.mu.Lock()
			counter.count = map[string]int{}
			counter.mu.Unlock()

			together, done := workergate.Together(ctx, client, c.calling+1)
			var wg sync.WaitGroup
			results := make([]bool, 3)
			calls := []func() (bool, error){
				func() (bool, error) { r, err := window.Allow(together, "k"); return r.Allowed, err },
				func() (bool, error) { r, err := meter.Allow(together, "k"); return r.Allowed, err },
				func() (bool, error) {
					l, _, err := capLimiter.Acquire(together, "k")
					return l != nil, err
				},
			}
			for i := range c.calling + 1 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer done()
					if i >= c.calling {
						return // leaves without a call
					}
					ok, err := calls[i]()
					if err != nil {
						t.Error(err)
					}
					results[i] = ok
				}()
			}
			wg.Wait()
			for i := range c.calling {
				if !results[i] {
					t.Errorf("call %d refused; want each admitted", i)
				}
			}
			if got := counter.pipelines.Load(); got != c.wantPipe {
				t.Errorf("%d pipelines, want %d", got, c.wantPipe)
			}
			counter.mu.Lock()
			single := counter.count["evalsha"] + counter.count["eval"]
			counter.mu.Unlock()
			// Each script call of the pipeline that Redis answered NOSCRIPT
			// is made again on its own: EVALSHA, then EVAL. On a shared
			// Redis (CI's Cluster, which other packages' tests use at the
			// same time) another process may load a script again between
			// the flush and the pipeline, so the test counts the NOSCRIPT
			// answers rather than assume all three; at least one must come.
			noscript := int(counter.noscript.Load())
			if c.flush && noscript == 0 {
				t.Errorf("no call of the pipeline was answered NOSCRIPT after the flush")
			}
			want := 2 * noscript
			if single != want {
				t.Errorf("%d script calls on their own, want %d", single, want)
			}
			// Later calls of that context go on their own, answered.
			if r, err := window.Allow(together, "k"); err != nil || (r.Allowed && c.calling >= 1) {
				t.Errorf("a later call: %+v, %v; want refused by the window, on its own", r, err)
			}
		})
	}
}
