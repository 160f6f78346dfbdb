package throttle_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// gate holds every single script call (a decision's own round trip) until
// released, so that a test can fill the coalescer's lanes and queue
// decisions behind them.
type gate struct {
	commandCounter
	entered  chan struct{} // a token per held call
	released chan struct{}
}

func newGate() *gate {
	return &gate{commandCounter: commandCounter{count: map[string]int{}}, entered: make(chan struct{}, 100), released: make(chan struct{})}
}

func (g *gate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	counted := g.commandCounter.ProcessHook(next)
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" {
			g.entered <- struct{}{}
			<-g.released
		}
		return counted(ctx, cmd)
	}
}

// fillLanes starts one decision per lane of l, each on a key of its own
// ("lane0", ...), and returns when all are held in g, with a function that
// waits for their results and, when succeed is true, checks that they
// succeeded.
func fillLanes(t *testing.T, l *throttle.Limiter, g *gate) (wait func(succeed bool)) {
	t.Helper()
	errs := make(chan error, throttle.CoalesceLanes)
	for i := range throttle.CoalesceLanes {
		go func() {
			_, err := l.Allow(context.Background(), "lane"+itoa(i))
			errs <- err
		}()
	}
	for range throttle.CoalesceLanes {
		<-g.entered
	}
	return func(succeed bool) {
		for range throttle.CoalesceLanes {
			if err := <-errs; err != nil && succeed {
				t.Errorf("a lane's decision: %v", err)
			}
		}
	}
}

// waitQueued waits until n decisions wait in l's queue.
func waitQueued(t *testing.T, l *throttle.Limiter, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for throttle.Queued(l) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d decisions queued, want %d", throttle.Queued(l), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// coalescedCall is one decision of a coalescing test: Allow, or Peek.
type coalescedCall struct {
	key  string
	peek bool
}

// queueBehindLanes fills the lanes of a Limiter of policy p coalescing up
// to limit decisions, queues calls behind them one after another, then
// lets everything through, and returns the calls' results and how many
// pipelines carried them. The script is loaded beforehand, so no pipeline
// is answered NOSCRIPT and sent again.
func queueBehindLanes(t *testing.T, tg *redistest.Target, p throttle.Policy, limit int, calls []coalescedCall) ([]throttle.Result, int) {
	t.Helper()
	peek(t, newLimiter(t, tg, p), "warm") // loads the script
	g := newGate()
	c := tg.NewClient(t)
	c.AddHook(g)
	shared, err := throttle.New(c, "shared", p, throttle.WithPrefix(tg.Prefix+"c:"), throttle.WithCoalescing(limit))
	if err != nil {
		t.Fatal(err)
	}
	results := make([]throttle.Result, len(calls))
	errs := make([]error, len(calls))
	var done sync.WaitGroup
	lanes := fillLanes(t, shared, g)
	for i, cl := range calls {
		done.Add(1)
		go func() {
			defer done.Done()
			if cl.peek {
				results[i], errs[i] = shared.Peek(context.Background(), cl.key)
			} else {
				results[i], errs[i] = shared.Allow(context.Background(), cl.key)
			}
		}()
		waitQueued(t, shared, i+1)
	}
	close(g.released)
	done.Wait()
	lanes(true)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("call %d %+v: %v", i, calls[i], err)
		}
	}
	return results, int(g.pipelines.Load())
}

// TestCoalescingSharesRoundTrips: while a Limiter's lanes are busy, 50
// decisions queue up. Coalescing up to 64, they go in one pipeline, in
// order: Allow and Peek on three keys, each with exactly the Result the
// same calls one by one get. Coalescing up to 16, 50 decisions on keys of
// their own go in four pipelines, and each is admitted. For every
// algorithm.
func TestCoalescingSharesRoundTrips(t *testing.T) {
	const queued = 50
	for _, a := range algorithms() {
		t.Run(a.name, func(t *testing.T) {
			tg := redistest.Embedded(t)
			tg.Clock(t)
			var calls []coalescedCall
			for i := range queued {
				calls = append(calls, coalescedCall{"k" + itoa(i%3), i%5 == 4})
			}
			results, pipelines := queueBehindLanes(t, tg, a.policy, 64, calls)
			single := newLimiter(t, tg, a.policy)
			for i, cl := range calls {
				var want throttle.Result
				if cl.peek {
					want = peek(t, single, cl.key)
				} else {
					want = allowN(t, single, cl.key, 1)
				}
				if asDecision(results[i]) != asDecision(want) {
					t.Fatalf("call %d %+v: coalesced %+v, one by one %+v", i, cl, results[i], want)
				}
			}
			if pipelines != 1 {
				t.Fatalf("%d pipelines for %d queued decisions, want 1", pipelines, queued)
			}

			tg = redistest.Embedded(t)
			tg.Clock(t)
			calls = calls[:0]
			for i := range queued {
				calls = append(calls, coalescedCall{"own" + itoa(i), false})
			}
			results, pipelines = queueBehindLanes(t, tg, a.policy, 16, calls)
			for i, r := range results {
				if !r.Allowed || r.Remaining != 4 {
					t.Fatalf("call %d on a key of its own: %+v", i, r)
				}
			}
			if pipelines != 4 {
				t.Fatalf("%d pipelines for %d queued decisions, at most 16 each; want 4", pipelines, queued)
			}
		})
	}
}

// TestCoalescingCancelledWhileQueued: a caller that gives up while its
// decision waits to be sent gets its context's error, and its decision is
// never made.
func TestCoalescingCancelledWhileQueued(t *testing.T) {
	tg := redistest.Embedded(t)
	tg.Clock(t)
	g := newGate()
	c := tg.NewClient(t)
	c.AddHook(g)
	l, err := throttle.New(c, "l", throttle.GCRA{Rate: throttle.PerSecond(1), Burst: 5}, throttle.WithPrefix(tg.Prefix), throttle.WithCoalescing(8))
	if err != nil {
		t.Fatal(err)
	}
	lanes := fillLanes(t, l, g)
	ctx, cancel := context.WithCancel(context.Background())
	second := make(chan error, 1)
	go func() {
		_, err := l.Allow(ctx, "k")
		second <- err
	}()
	waitQueued(t, l, 1)
	cancel()
	if err := <-second; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled while queued: %v, want context.Canceled", err)
	}
	waitQueued(t, l, 0)
	close(g.released)
	lanes(true)
	if r := peek(t, l, "k"); r.Remaining != 5 {
		t.Fatalf("%d remaining after the only decision on the key was abandoned, want 5", r.Remaining)
	}
	if _, err := throttle.New(tg.Client, "limiter", throttle.GCRA{Rate: throttle.PerSecond(1), Burst: 1}, throttle.WithCoalescing(-1)); !errors.Is(err, throttle.ErrInvalidOption) {
		t.Fatalf("negative limit: %v", err)
	}
}

// TestCoalescingQueuedCallerKeepsTheTimeout: a caller queued behind busy
// lanes is answered when WithTimeout has passed since its call, with
// ErrUnavailable (or admitted and Degraded under FailOpen), and leaves the
// queue. (Whether its decision is then made depends on whether a lane,
// itself timed out a moment earlier, took it into a round trip first;
// TestCoalescingCancelledWhileQueued shows a decision left in the queue is
// never made.)
func TestCoalescingQueuedCallerKeepsTheTimeout(t *testing.T) {
	for _, policy := range []throttle.FailurePolicy{throttle.FailClosed, throttle.FailOpen} {
		t.Run(policy.String(), func(t *testing.T) {
			tg := redistest.Embedded(t)
			tg.Clock(t)
			g := newGate()
			c := tg.NewClient(t)
			c.AddHook(g)
			const timeout = 200 * time.Millisecond
			// The lanes' own calls are held past their timeout too; they
			// run detached, so the test releases them at the end.
			l, err := throttle.New(c, "l", throttle.GCRA{Rate: throttle.PerSecond(1), Burst: 5}, throttle.WithPrefix(tg.Prefix),
				throttle.WithTimeout(timeout), throttle.WithFailurePolicy(policy))
			if err != nil {
				t.Fatal(err)
			}
			lanes := fillLanes(t, l, g)
			start := time.Now()
			r, err := l.Allow(context.Background(), "k")
			took := time.Since(start)
			switch policy {
			case throttle.FailClosed:
				if !errors.Is(err, throttle.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("queued past the timeout: %+v, %v; want ErrUnavailable and DeadlineExceeded", r, err)
				}
			case throttle.FailOpen:
				if err != nil || !r.Allowed || !r.Degraded {
					t.Fatalf("queued past the timeout under fail-open: %+v, %v; want admitted and degraded", r, err)
				}
			}
			if took < timeout || took > timeout+5*time.Second {
				t.Fatalf("answered after %s, want the timeout, %s", took, timeout)
			}
			if n := throttle.Queued(l); n != 0 {
				t.Fatalf("%d decisions still queued", n)
			}
			close(g.released)
			lanes(false)
		})
	}
}
