package worker_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
)

// TestRetryDelayOfAHandlersThrottledError: a *ThrottledError a handler
// built, as asynq's docs suggest for rate-limit errors, comes back after
// its RetryAfter (at least a second), not at once.
func TestRetryDelayOfAHandlersThrottledError(t *testing.T) {
	delay := worker.RetryDelayFunc(nil)
	task := asynq.NewTask("x", nil)
	for _, tc := range []struct {
		retryAfter, least time.Duration
	}{
		{3 * time.Second, 3 * time.Second},
		{1500 * time.Millisecond, 1500 * time.Millisecond},
		{0, time.Second},
		{-time.Minute, time.Second},
	} {
		err := &worker.ThrottledError{Rule: "partner", Key: "acme", RetryAfter: tc.retryAfter}
		// asynq keeps now + delay in whole seconds, rounded down.
		now := time.Now()
		stored := time.Unix(now.Add(delay(0, err, task)).Unix(), 0)
		if back := stored.Sub(now); back < tc.least-time.Millisecond {
			t.Errorf("RetryAfter %s: back after %s; want at least %s", tc.retryAfter, back, tc.least)
		}
		// Wrapped by the handler, too.
		wrapped := delay(0, errors.Join(errors.New("partner said 429"), err), task)
		if time.Unix(now.Add(wrapped).Unix(), 0).Sub(now) < tc.least-time.Millisecond {
			t.Errorf("RetryAfter %s, wrapped: back after %s", tc.retryAfter, wrapped)
		}
	}
}

// TestHandlersThrottledErrorOnRealServers: a handler that returns its own
// *ThrottledError sees its task come back after RetryAfter with no retry
// used and nothing counted as failed; a task with no retries left is
// handed over instead of archived; tasks no rule matches are covered too.
func TestHandlersThrottledErrorOnRealServers(t *testing.T) {
	tg := redistest.New(t)
	limiter := asynqtest.NewLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(100), Burst: 100})
	th := asynqtest.NewThrottler(t, tg, []worker.Rule{worker.Rate("any", worker.Type("ruled"), limiter, worker.KeyBy(worker.ByType()))})
	var mu sync.Mutex
	attempts := map[string][]time.Time{}
	retried := map[string][]int{}
	handler := asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id := worker.OriginalTaskID(ctx, task)
		n, _ := asynq.GetRetryCount(ctx)
		mu.Lock()
		defer mu.Unlock()
		attempts[id] = append(attempts[id], time.Now())
		retried[id] = append(retried[id], n)
		if len(attempts[id]) == 1 {
			return &worker.ThrottledError{Rule: "partner", Key: "acme", RetryAfter: 2 * time.Second}
		}
		return nil
	})
	var log asynqtest.RunLog
	f := asynqtest.NewFleet(t, tg, 1, 4, th, handler)
	var ids []string
	for _, typ := range []string{"ruled", "unruled"} {
		ids = append(ids, f.Enqueue(t, typ, nil), f.Enqueue(t, typ, nil, asynq.MaxRetry(0)))
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		done := 0
		for _, id := range ids {
			if len(attempts[id]) >= 2 {
				done++
			}
		}
		mu.Unlock()
		if done == len(ids) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s: attempts %v", attempts)
		}
		time.Sleep(50 * time.Millisecond)
	}
	info := f.WaitDone(t, &log, 0, 30*time.Second)
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		a := attempts[id]
		if len(a) != 2 {
			t.Errorf("task %s ran %d times, want 2", id, len(a))
			continue
		}
		if gap := a[1].Sub(a[0]); gap < 2*time.Second-10*time.Millisecond {
			t.Errorf("task %s came back %s after its throttle; RetryAfter was 2 s", id, gap)
		}
		if retried[id][1] != 0 {
			t.Errorf("task %s came back with %d retries used; a throttle uses none", id, retried[id][1])
		}
	}
	if info.Archived != 0 || info.Failed != 0 || info.Retry != 0 {
		t.Errorf("queue after the run: %d archived, %d failed, %d retrying; want none", info.Archived, info.Failed, info.Retry)
	}
}

// TestLostLeaseStopsTheHandler: when a running task's concurrency lease is
// lost (here its key is reset, so another holder could take the slot), the
// handler's context is cancelled with a cause wrapping
// throttle.ErrLeaseLost, a LeaseLost event says so, and the task goes back
// as throttled, not failed, and runs again to its end.
func TestLostLeaseStopsTheHandler(t *testing.T) {
	tg := redistest.New(t)
	conc, err := throttle.NewConcurrencyLimiter(tg.NewClient(t), "conc", throttle.Concurrency{Limit: 1, Lease: 600 * time.Millisecond}, throttle.WithPrefix(tg.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	var seen asynqtest.Events
	th := asynqtest.NewThrottler(t, tg, []worker.Rule{worker.Concurrency("export", worker.AnyTask(), conc, worker.KeyBy(worker.ByType()))}, worker.WithObserver(&seen))
	started := make(chan struct{}, 4)
	causes := make(chan error, 4)
	var runs sync.Map
	handler := asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		n, _ := runs.LoadOrStore(task.ResultWriter().TaskID(), new(int))
		*n.(*int)++
		if *n.(*int) > 1 {
			return nil // the second run finishes
		}
		started <- struct{}{}
		select {
		case <-ctx.Done():
			causes <- context.Cause(ctx)
			return ctx.Err()
		case <-time.After(10 * time.Second):
			causes <- nil
			return nil
		}
	})
	var log asynqtest.RunLog
	f := asynqtest.NewFleet(t, tg, 1, 2, th, handler)
	id := f.Enqueue(t, "export", nil)
	<-started
	if err := conc.Reset(context.Background(), "export"); err != nil {
		t.Fatal(err)
	}
	select {
	case cause := <-causes:
		if !errors.Is(cause, throttle.ErrLeaseLost) {
			t.Fatalf("the handler's context ended with cause %v; want one wrapping throttle.ErrLeaseLost", cause)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the handler ran on 5 s after its lease was reset (lease 600 ms)")
	}
	info := f.WaitDone(t, &log, 0, 30*time.Second)
	if n, _ := runs.Load(id); n == nil || *n.(*int) != 2 {
		t.Fatalf("task ran %v times; want 2 (stopped, then to its end)", n)
	}
	if info.Archived != 0 || info.Failed != 0 {
		t.Fatalf("%d archived, %d failed; want none", info.Archived, info.Failed)
	}
	if seen.Count(worker.LeaseLost) != 1 || seen.Count(worker.Rescheduled) != 1 {
		t.Fatalf("events %v; want one lease_lost and one rescheduled", seen.ByKind())
	}
}

// TestAPanicBeforeTheHandlerFreesTheCapsSlot: a FairBy function that
// panics (on a payload it cannot read) while the task holds a cap's slot,
// or an Observer that panics as the task is admitted, leaves the slot
// free: the panic goes to asynq, which recovers it, and the slot is not
// held, renewed, by a task that will never release it.
func TestAPanicBeforeTheHandlerFreesTheCapsSlot(t *testing.T) {
	tg := redistest.New(t)
	ctx := context.Background()
	conc, err := throttle.NewConcurrencyLimiter(tg.NewClient(t), "conc", throttle.Concurrency{Limit: 1, Lease: time.Minute}, throttle.WithPrefix(tg.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	overall := asynqtest.NewLimiter(t, tg, throttle.GCRA{Rate: throttle.PerHour(1), Burst: 1})
	flow := func(_ context.Context, task *asynq.Task) (string, error) {
		if strings.Contains(string(task.Payload()), "unreadable") {
			panic("a payload the flow function cannot read")
		}
		return "tenant", nil
	}
	panicky := worker.ObserverFunc(func(_ context.Context, e worker.Event) {
		if e.Kind == worker.Admitted && e.TaskType == "observed" {
			panic("a bug in the observer")
		}
	})
	th := asynqtest.NewThrottler(t, tg, []worker.Rule{
		worker.Concurrency("one", worker.AnyTask(), conc, worker.KeyBy(worker.Constant("slot"))),
		worker.Rate("overall", worker.Type("sync"), overall, worker.KeyBy(worker.Constant("all")), worker.FairBy(flow)),
	}, worker.WithObserver(panicky))
	var log asynqtest.RunLog
	f := asynqtest.NewFleet(t, tg, 1, 2, th, log.Handler(0))
	f.Enqueue(t, "sync", "fine")
	f.WaitDone(t, &log, 1, 10*time.Second) // it takes the hour's only start
	for _, c := range []struct{ typ, payload string }{{"sync", "unreadable"}, {"observed", ""}} {
		id := f.Enqueue(t, c.typ, c.payload)
		if info := waitState(t, f, id, asynq.TaskStateRetry); !strings.Contains(info.LastErr, "panic") {
			t.Fatalf("%s: back in asynq's retry set with %q; want the panic", c.typ, info.LastErr)
		}
		if r, err := conc.Peek(ctx, "slot"); err != nil || r.Remaining != 1 {
			t.Fatalf("after a panic before %s's handler: %+v, %v; want the cap's one slot free", c.typ, r, err)
		}
	}
}

// TestLeasesOutliveAPanickingHandler: a handler that panics, fails or
// succeeds under a cap of 1 has its lease released each time (asynq
// recovers the panic): the next task takes the slot at once, not after
// the lease (a minute) runs out.
func TestLeasesOutliveAPanickingHandler(t *testing.T) {
	tg := redistest.New(t)
	conc, err := throttle.NewConcurrencyLimiter(tg.NewClient(t), "conc", throttle.Concurrency{Limit: 1, Lease: time.Minute}, throttle.WithPrefix(tg.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	var seen asynqtest.Events
	th := asynqtest.NewThrottler(t, tg, []worker.Rule{
		worker.Concurrency("one", worker.AnyTask(), conc, worker.KeyBy(worker.Constant("slot"))),
	}, worker.WithObserver(&seen))
	var mu sync.Mutex
	ran := map[string]int{}
	handler := asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		mu.Lock()
		ran[task.Type()]++
		n := ran[task.Type()]
		mu.Unlock()
		switch {
		case task.Type() == "panics" && n == 1:
			panic("a bug in the handler")
		case task.Type() == "fails" && n == 1:
			return errors.New("a failure")
		}
		return nil
	})
	f := asynqtest.NewFleet(t, tg, 1, 3, th, handler)
	for _, typ := range []string{"panics", "fails", "succeeds"} {
		f.Enqueue(t, typ, nil, asynq.MaxRetry(1))
	}
	// asynq retries the panicked and the failed task after its own delay;
	// the three first runs show the slot freed after each.
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		firsts := ran["panics"] >= 1 && ran["fails"] >= 1 && ran["succeeds"] >= 1
		mu.Unlock()
		if firsts {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 20 s the cap of 1 let through %v: a lease was not released", ran)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if taken, released := seen.Count(worker.LeaseTaken), seen.Count(worker.LeaseReleased); taken < 3 || released < 2 {
		t.Fatalf("leases taken %d, released %d", taken, released)
	}
}
