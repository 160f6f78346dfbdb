package worker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/gate"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
)

// bringBack moves a task waiting in the retry set back to pending at once,
// as if its time had come, and waits until it has been through the gate
// again (it is back in the retry set, or gone from it).
func bringBack(t *testing.T, f *asynqtest.Fleet, id string) *asynq.TaskInfo {
	t.Helper()
	waitState(t, f, id, asynq.TaskStateRetry)
	if err := f.Inspector.RunTask(f.Queue, id); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := f.Inspector.GetTaskInfo(f.Queue, id)
		if err == nil && info.State != asynq.TaskStatePending && info.State != asynq.TaskStateActive {
			return info
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s never left pending/active: %+v, %v", id, info, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitState(t *testing.T, f *asynqtest.Fleet, id string, want asynq.TaskState) *asynq.TaskInfo {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := f.Inspector.GetTaskInfo(f.Queue, id)
		if err == nil && info.State == want {
			return info
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s not %v after 10s: %+v, %v", id, want, info, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestThrottlingUsesNoRetries: a task throttled again and again keeps its
// whole retry budget and is not counted as failed.
func TestThrottlingUsesNoRetries(t *testing.T) {
	tg := redistest.New(t)
	limiter := asynqtest.NewLimiter(t, tg, throttle.FixedWindow{Limit: 1, Window: redistest.FarWindow})
	th := asynqtest.NewThrottler(t, tg, []worker.Rule{worker.Rate("hourly", worker.AnyTask(), limiter, worker.KeyBy(worker.ByType()))})
	var log asynqtest.RunLog
	f := asynqtest.NewFleet(t, tg, 1, 2, th, log.Handler(0))
	f.Enqueue(t, "sync", nil)
	f.WaitDone(t, &log, 1, 10*time.Second) // it takes the hour's only unit
	throttled := f.Enqueue(t, "sync", nil, asynq.MaxRetry(1))
	for range 4 {
		info := bringBack(t, f, throttled)
		if info.State != asynq.TaskStateRetry || info.Retried != 0 || !strings.Contains(info.LastErr, "throttled by rule \"hourly\"") {
			t.Fatalf("after a throttle: state %v, retried %d of %d, last error %q", info.State, info.Retried, info.MaxRetry, info.LastErr)
		}
		if wait := time.Until(info.NextProcessAt); wait < 30*time.Second {
			t.Fatalf("rescheduled to return in %s; the window's turn is years off", wait)
		}
	}
	q, err := f.Inspector.GetQueueInfo(f.Queue)
	if err != nil || q.Failed != 0 || q.Archived != 0 {
		t.Fatalf("queue %+v, %v: throttling counted as failure", q, err)
	}
	// Its turn comes (the window is reset): it runs, its budget intact.
	if err := limiter.Reset(context.Background(), "sync"); err != nil {
		t.Fatal(err)
	}
	if err := f.Inspector.RunTask(f.Queue, throttled); err != nil {
		t.Fatal(err)
	}
	f.WaitDone(t, &log, 2, 10*time.Second)
}

// TestGiveUpArchivesWithAClearError: a rule that may send a task back twice
// archives it, with a *GaveUpError message, on the third throttle.
func TestGiveUpArchivesWithAClearError(t *testing.T) {
	tg := redistest.New(t)
	limiter := asynqtest.NewLimiter(t, tg, throttle.FixedWindow{Limit: 1, Window: redistest.FarWindow})
	var seen asynqtest.Events
	th := asynqtest.NewThrottler(t, tg, []worker.Rule{
		worker.Rate("hourly", worker.AnyTask(), limiter, worker.GiveUp(worker.GiveUpPolicy{MaxThrottles: 2}), worker.KeyBy(worker.ByType())),
	}, worker.WithObserver(&seen))
	var log asynqtest.RunLog
	f := asynqtest.NewFleet(t, tg, 1, 2, th, log.Handler(0))
	f.Enqueue(t, "sync", nil)
	f.WaitDone(t, &log, 1, 10*time.Second) // it takes the hour's only unit
	doomed := f.Enqueue(t, "sync", nil)
	bringBack(t, f, doomed)         // second throttle
	info := bringBack(t, f, doomed) // third: gives up
	if info.State != asynq.TaskStateArchived {
		t.Fatalf("after 3 throttles with MaxThrottles 2: state %v, last error %q", info.State, info.LastErr)
	}
	const want = `worker: gave up after rule "hourly" throttled the task 3 times`
	if !strings.HasPrefix(info.LastErr, want) {
		t.Fatalf("archived with %q, want it to start %q", info.LastErr, want)
	}
	if seen.Count(worker.GaveUp) != 1 || seen.Count(worker.Rescheduled) != 2 {
		t.Fatalf("events %v: want 2 rescheduled and 1 gave up", seen.ByKind())
	}
	if log.Count() != 1 {
		t.Fatalf("%d runs, want only the first task's", log.Count())
	}
}

// TestGivingUpLeavesTheWaitingRoom: a task given up on while it waits in a
// waiting room leaves it, so that the room lets nobody out for a task that
// is gone (its slot would go unused): once it is archived, the room holds
// only the one waiter put in after it.
func TestGivingUpLeavesTheWaitingRoom(t *testing.T) {
	tg := redistest.New(t)
	limiter := asynqtest.NewLimiter(t, tg, throttle.GCRA{Rate: throttle.PerHour(1), Burst: 1})
	th := asynqtest.NewThrottler(t, tg, []worker.Rule{
		worker.Rate("overall", worker.AnyTask(), limiter, worker.KeyBy(worker.Constant("all")), worker.FairBy(worker.ByType()),
			worker.GiveUp(worker.GiveUpPolicy{MaxThrottles: 1})),
	})
	var log asynqtest.RunLog
	f := asynqtest.NewFleet(t, tg, 1, 2, th, log.Handler(0))
	f.Enqueue(t, "sync", nil)
	f.WaitDone(t, &log, 1, 10*time.Second) // it takes the hour's only start
	doomed := f.Enqueue(t, "sync", nil)
	if info := bringBack(t, f, doomed); info.State != asynq.TaskStateArchived {
		t.Fatalf("throttled twice with MaxThrottles 1: state %v, last error %q", info.State, info.LastErr)
	}
	size, _, err := gate.EnterRoom(context.Background(), limiter, "all", "probe", "sync", 1, 1, 0, "p")
	if err != nil {
		t.Fatal(err)
	}
	if size != 1 {
		t.Fatalf("the room holds %d waiters after the probe entered; want 1: the task given up on left it", size)
	}
}
