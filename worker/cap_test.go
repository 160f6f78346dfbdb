package worker_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
)

// capRun is what a run of tasks under a concurrency cap measured.
type capRun struct {
	span       time.Duration // first lease taken to last released
	heldShare  float64       // of limit × span, the part the cap was held
	mostHeld   int
	worstWake  time.Duration // longest from a release to the next lease taken while tasks waited
	trips      int
	roundTrips float64
}

// leaseLog records the worker's lease events in order, with their times.
type leaseLog struct {
	mu     sync.Mutex
	events []leaseEvent
	all    asynqtest.Events
}

type leaseEvent struct {
	at    time.Time
	taken bool
}

func (l *leaseLog) Observe(ctx context.Context, e worker.Event) {
	l.all.Observe(ctx, e)
	if e.Kind != worker.LeaseTaken && e.Kind != worker.LeaseReleased {
		return
	}
	l.mu.Lock()
	l.events = append(l.events, leaseEvent{time.Now(), e.Kind == worker.LeaseTaken})
	l.mu.Unlock()
}

// runCapped runs tasks of work each under a cap of limit on servers of 10
// workers and returns what it measured.
func runCapped(tb testing.TB, tg *redistest.Target, tasks, limit, servers int, work time.Duration) capRun {
	tb.Helper()
	counter := &roundTrips{}
	client := tg.NewClient(tb)
	client.AddHook(counter)
	capLimiter, err := throttle.NewConcurrencyLimiter(client, "capLimiter", throttle.Concurrency{Limit: limit, Lease: 10 * time.Second}, throttle.WithPrefix(tg.Prefix))
	if err != nil {
		tb.Fatal(err)
	}
	var log leaseLog
	th, err := worker.New(client, []worker.Rule{worker.Concurrency("exports", worker.Type("export"), capLimiter, worker.KeyBy(worker.ByType()))},
		worker.WithPrefix(tg.Prefix), worker.WithObserver(&log), worker.WithLogger(nil))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = th.Close(context.Background()) })
	var runs asynqtest.RunLog
	handler := asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		runs.Add(worker.OriginalTaskID(ctx, task), "")
		time.Sleep(work)
		return nil
	})
	f := asynqtest.NewFleet(tb, tg, 0, 0, th, nil)
	for range servers {
		f.AddServer(tb, 10, th, handler)
	}
	var ids []string
	for i := range tasks {
		ids = append(ids, f.Enqueue(tb, "export", map[string]int{"n": i}))
	}
	info := f.WaitDone(tb, &runs, tasks, time.Minute)
	asynqtest.CheckOnce(tb, runs.Snapshot(), ids)
	if info.Archived != 0 || info.Failed != 0 {
		tb.Fatalf("%d archived, %d failed", info.Archived, info.Failed)
	}
	// Wait for the last release to be seen.
	deadline := time.Now().Add(5 * time.Second)
	for log.all.Count(worker.LeaseReleased) < tasks && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	log.mu.Lock()
	events := slices.Clone(log.events)
	log.mu.Unlock()
	var out capRun
	held, waiting := 0, tasks
	var heldFor time.Duration
	var lastRelease time.Time
	for i, e := range events {
		if i > 0 {
			heldFor += time.Duration(held) * e.at.Sub(events[i-1].at)
		}
		if e.taken {
			if held == limit-1 && waiting > 0 && !lastRelease.IsZero() {
				out.worstWake = max(out.worstWake, e.at.Sub(lastRelease))
			}
			held++
			waiting--
			out.mostHeld = max(out.mostHeld, held)
		} else {
			held--
			lastRelease = e.at
		}
	}
	out.span = events[len(events)-1].at.Sub(events[0].at)
	out.heldShare = float64(heldFor) / float64(time.Duration(limit)*out.span)
	out.trips = log.all.Count(worker.Rescheduled)
	out.roundTrips = float64(counter.n.Load()) / float64(tasks)
	return out
}

// TestCapIsHeldWhileTasksWait: 30 tasks of 200 ms under a cap of 3 on two
// servers of 10 workers take the 2.0 s the cap allows, give or take 0.5 s:
// while tasks wait the cap is held at least 80% of the time (each of the 27
// hand-overs idles its slot for a wake-up's latency: measured 90.0-94.1%
// in CI's embedded pass, -race beside the other packages' tests, and 88.8%
// with a third process keeping a core busy; on 2026-12-03, 93.7-98.4% in
// eleven passes of fresh-clone CI runs, but 82.8% over 2.449 s and 87.7%
// over 2.314 s in two more, the same code as passes that held 96%: a
// called-back task crosses asynq, whose poll a busy machine delays), and a task
// waiting inline takes a freed slot within 50 ms (both measured on the
// wall clock between the worker's lease events, in one process). A woken
// waiter is a goroutine the Go scheduler must run, twice (to hear the
// wake-up, then to take the slot): the 50 ms carry asynqtest.StartJitter
// for it. Measured: at most 4–13 ms on every backend in CI, 52.6 ms once
// with -race while other packages' tests ran beside it.
func TestCapIsHeldWhileTasksWait(t *testing.T) {
	tg := redistest.New(t)
	out := runCapped(t, tg, 30, 3, 2, 200*time.Millisecond)
	t.Logf("figures: 30 tasks of 200 ms under a cap of 3: %s from the first lease to the last release, cap held %.1f%% of it, at most %d at once, a freed slot taken at most %s after its release; %d trips through asynq, %.2f Redis round trips per task",
		out.span.Round(time.Millisecond), 100*out.heldShare, out.mostHeld, out.worstWake.Round(time.Microsecond), out.trips, out.roundTrips)
	if out.mostHeld > 3 {
		t.Errorf("%d leases held at once; the cap is 3", out.mostHeld)
	}
	if out.span > 2500*time.Millisecond {
		t.Errorf("the tasks took %s; the cap allows 2.0 s, want at most 2.5 s", out.span)
	}
	if out.heldShare < 0.80 {
		t.Errorf("the cap was held %.1f%% of the time; want at least 80%%", 100*out.heldShare)
	}
	if out.worstWake > 50*time.Millisecond+asynqtest.StartJitter {
		t.Errorf("a freed slot was taken %s after its release; want within 50 ms (+ %s for the scheduler)", out.worstWake, asynqtest.StartJitter)
	}
}
