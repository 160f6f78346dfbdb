package throttle_test

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// outcome is one decision made during an outage test.
type outcome struct {
	took     time.Duration
	down     bool // started while Redis was stopped or paused
	allowed  bool
	degraded bool
	err      error
}

// hammer makes decisions on l from workers goroutines until stop is
// closed, marking those that start while down reports true.
func hammer(l *throttle.Limiter, workers int, down func() bool, stop <-chan struct{}) []outcome {
	var mu sync.Mutex
	var all []outcome
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []outcome
			for i := 0; ; i++ {
				select {
				case <-stop:
					mu.Lock()
					all = append(all, mine...)
					mu.Unlock()
					return
				default:
				}
				o := outcome{down: down()}
				start := time.Now()
				r, err := l.Allow(context.Background(), "tenant-"+itoa(w*7+i%7))
				o.took, o.allowed, o.degraded, o.err = time.Since(start), r.Allowed, r.Degraded, err
				mine = append(mine, o)
			}
		}()
	}
	wg.Wait()
	return all
}

// p99 returns the 99th percentile and the longest of the decisions' times.
func p99(outcomes []outcome) (time.Duration, time.Duration) {
	if len(outcomes) == 0 {
		return 0, 0
	}
	took := make([]time.Duration, len(outcomes))
	for i, o := range outcomes {
		took[i] = o.took
	}
	slices.Sort(took)
	return took[len(took)*99/100], took[len(took)-1]
}

// slack is what a busy 2-core CI machine may add to a bounded call: the
// bound says "returns within the timeout", not within it to the
// millisecond.
const slack = 2 * time.Second

// TestReliabilityRedisStopped: Redis is killed in the middle of a run and
// started again. Every decision returns within the timeout (plus slack);
// under fail-closed the ones Redis could not make fail with ErrUnavailable,
// under fail-open they are admitted and marked Degraded; once Redis is back
// the decisions are real again.
func TestReliabilityRedisStopped(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	const timeout = 250 * time.Millisecond
	for _, failure := range []throttle.FailurePolicy{throttle.FailClosed, throttle.FailOpen} {
		client := srv.Client(t, nil) // go-redis's defaults, as a user has them
		l, err := throttle.New(client, "l", throttle.GCRA{Rate: throttle.PerSecond(10000), Burst: 1000},
			throttle.WithTimeout(timeout), throttle.WithFailurePolicy(failure), throttle.WithLogger(nil))
		if err != nil {
			t.Fatal(err)
		}
		var down atomic.Bool
		stop := make(chan struct{})
		done := make(chan []outcome)
		go func() { done <- hammer(l, 8, down.Load, stop) }()
		time.Sleep(300 * time.Millisecond)
		srv.Stop(t)
		down.Store(true) // decisions from now on start with Redis dead
		time.Sleep(time.Second)
		down.Store(false)
		srv.Start(t)
		// Back: wait until a decision succeeds, then run a little longer.
		deadline := time.Now().Add(10 * time.Second)
		for {
			if r, err := l.Allow(context.Background(), "probe"); err == nil && !r.Degraded {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: decisions still fail 10s after Redis came back", failure)
			}
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(300 * time.Millisecond)
		close(stop)
		all := <-done

		var outage []outcome
		admitted, degraded, unavailable, afterOK := 0, 0, 0, 0
		for _, o := range all {
			if o.down {
				outage = append(outage, o)
			}
			switch {
			case o.err != nil:
				if !errors.Is(o.err, throttle.ErrUnavailable) {
					t.Fatalf("%s: %v; want only ErrUnavailable", failure, o.err)
				}
				if failure == throttle.FailOpen {
					t.Fatalf("%s: an error under fail-open: %v", failure, o.err)
				}
				unavailable++
			case o.degraded:
				if failure == throttle.FailClosed || !o.allowed {
					t.Fatalf("%s: degraded decision %+v", failure, o)
				}
				degraded++
			case o.allowed:
				admitted++
				if !o.down {
					afterOK++
				}
			}
		}
		p, longest := p99(outage)
		t.Logf("figures: %s %s: %d decisions, all returned (%d started while Redis was down), %d admitted by Redis, %d unavailable, %d degraded; "+
			"while down p99 %s, longest %s, bound %s (timeout) + %s slack",
			srv.Kind, failure, len(all), len(outage), admitted, unavailable, degraded, p.Round(time.Millisecond),
			longest.Round(time.Millisecond), timeout, slack)
		if len(outage) == 0 || afterOK == 0 {
			t.Fatalf("%s: %d decisions while down, %d admitted around it: the run did not cover the outage", failure, len(outage), afterOK)
		}
		if failure == throttle.FailClosed && unavailable == 0 || failure == throttle.FailOpen && degraded == 0 {
			t.Fatalf("%s: no decision saw the outage", failure)
		}
		if longest > timeout+slack {
			t.Fatalf("%s: a decision took %s with a %s timeout", failure, longest, timeout)
		}
	}
}

// TestReliabilitySlowRedis: Redis stops answering for a while but keeps its
// connections (CLIENT PAUSE). Decisions return at the timeout with
// ErrUnavailable, and once Redis answers again no goroutine is left
// behind: the count returns to where it was.
func TestReliabilitySlowRedis(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	const timeout = 100 * time.Millisecond
	for _, deadlines := range []bool{false, true} {
		client := srv.Client(t, &redis.Options{ContextTimeoutEnabled: deadlines})
		l, err := throttle.New(client, "l", throttle.GCRA{Rate: throttle.PerSecond(10000), Burst: 1000},
			throttle.WithTimeout(timeout), throttle.WithLogger(nil))
		if err != nil {
			t.Fatal(err)
		}
		for i := range 32 { // fill the pool before counting
			allowN(t, l, "warm-"+itoa(i), 1)
		}
		before := clientGoroutines()
		srv.Pause(t, 1500*time.Millisecond)
		pausedAt := time.Now()
		stop := make(chan struct{})
		time.AfterFunc(time.Second, func() { close(stop) })
		all := hammer(l, 16, func() bool { return time.Since(pausedAt) < time.Second }, stop)
		during := clientGoroutines() // the calls given up on still wait for Redis
		unavailable := 0
		for _, o := range all {
			if o.err != nil {
				if !errors.Is(o.err, throttle.ErrUnavailable) || !errors.Is(o.err, context.DeadlineExceeded) {
					t.Fatalf("ContextTimeoutEnabled=%v: %v; want ErrUnavailable wrapping DeadlineExceeded", deadlines, o.err)
				}
				unavailable++
			}
		}
		p, longest := p99(all)
		if unavailable == 0 {
			t.Fatalf("ContextTimeoutEnabled=%v: no decision timed out during the pause", deadlines)
		}
		if longest > timeout+slack {
			t.Fatalf("ContextTimeoutEnabled=%v: a decision took %s with a %s timeout", deadlines, longest, timeout)
		}
		// After the pause, everything a timed-out call left running ends.
		// Redis first works off what queued up during the pause: the first
		// decision after it may need more than the 100 ms timeout on a busy
		// machine, so it is asked until it is answered.
		time.Sleep(time.Until(pausedAt.Add(1500 * time.Millisecond)))
		for answered := time.Now().Add(10 * time.Second); ; {
			_, err := l.AllowN(context.Background(), "after", 1)
			if err == nil {
				break
			}
			if time.Now().After(answered) {
				t.Fatalf("ContextTimeoutEnabled=%v: Redis did not answer 10 s after the pause: %v", deadlines, err)
			}
		}
		after := clientGoroutines()
		for deadline := time.Now().Add(15 * time.Second); after > before && time.Now().Before(deadline); after = clientGoroutines() {
			time.Sleep(50 * time.Millisecond)
		}
		t.Logf("figures: %s paused 1.5s, ContextTimeoutEnabled=%v: %d decisions, %d timed out; p99 %s, longest %s, bound %s + %s slack; goroutines %d before, %d at the end of the pause, %d after",
			srv.Kind, deadlines, len(all), unavailable, p.Round(time.Millisecond), longest.Round(time.Millisecond), timeout, slack, before, during, after)
		if after > before {
			t.Fatalf("ContextTimeoutEnabled=%v: %d goroutines before the pause, %d after it ended", deadlines, before, after)
		}
	}
}

// TestReliabilityScriptFlush: the server's scripts are flushed again and
// again while many callers decide, alone, coalesced and in AllowMany
// batches. Every decision is made, none twice: the count Redis keeps
// equals the admissions the callers saw.
func TestReliabilityScriptFlush(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	tg := srv.Target(t)
	const limit = 1_000_000
	single := newLimiter(t, tg, throttle.FixedWindow{Limit: limit, Window: redistest.FarWindow}, throttle.WithCoalescing(0))
	shared := newLimiter(t, tg, throttle.FixedWindow{Limit: limit, Window: redistest.FarWindow})
	ctx := context.Background()
	stop := make(chan struct{})
	var flushes atomic.Int64
	flusher := make(chan struct{})
	go func() {
		defer close(flusher)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := tg.Client.ScriptFlush(ctx).Err(); err != nil {
				t.Errorf("SCRIPT FLUSH: %v", err)
				return
			}
			flushes.Add(1)
			time.Sleep(time.Millisecond)
		}
	}()
	var admitted, failed atomic.Int64
	var wg sync.WaitGroup
	for w := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 150 {
				switch w % 3 {
				case 0:
					r, err := single.Allow(ctx, "k")
					count(r, err, &admitted, &failed)
				case 1:
					r, err := shared.Allow(ctx, "k")
					count(r, err, &admitted, &failed)
				default:
					if i%10 != 0 {
						continue
					}
					results, err := shared.AllowMany(ctx, []throttle.Request{{Key: "k", N: 1}, {Key: "k", N: 2}, {Key: "k", N: 1}})
					if err != nil {
						failed.Add(1)
						continue
					}
					for j, r := range results {
						if r.Allowed {
							admitted.Add(int64([]int{1, 2, 1}[j]))
						}
					}
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-flusher
	r := peek(t, single, "k")
	used := int64(limit - r.Remaining)
	t.Logf("figures: %s: %d decisions' units admitted while SCRIPT FLUSH ran %d times; %d failed; Redis counted %d units",
		srv.Kind, admitted.Load(), flushes.Load(), failed.Load(), used)
	if failed.Load() != 0 {
		t.Fatalf("%d decisions failed across SCRIPT FLUSH", failed.Load())
	}
	if flushes.Load() < 10 {
		t.Fatalf("only %d flushes happened during the run", flushes.Load())
	}
	if used != admitted.Load() {
		t.Fatalf("Redis counted %d units, callers saw %d admitted: a decision was lost or made twice", used, admitted.Load())
	}
}

// count tallies one decision.
func count(r throttle.Result, err error, admitted, failed *atomic.Int64) {
	switch {
	case err != nil:
		failed.Add(1)
	case r.Allowed:
		admitted.Add(1)
	}
}

// clientGoroutines counts this process's goroutines but those of the
// embedded server and the test proxy, which serve each open connection:
// what is left is the library's, the client's and the tests'.
func clientGoroutines() int {
	count := 0
	for _, g := range goroutineStacks() {
		if !strings.Contains(g, "miniredis") && !strings.Contains(g, "redistest.(*Proxy)") {
			count++
		}
	}
	return count
}

// goroutineStacks returns the stack of every goroutine of the process.
func goroutineStacks() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Split(string(buf[:n]), "\n\n")
		}
		buf = make([]byte, 2*len(buf))
	}
}
