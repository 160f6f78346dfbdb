package scheduler_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/scheduler"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
)

// pacingThrottler returns a throttler with one GCRA rule of rate per
// second, burst 1, on "sync" tasks.
func pacingThrottler(t *testing.T, tg *redistest.Target, rate int, events worker.Observer) *worker.Throttler {
	t.Helper()
	limiter := asynqtest.NewLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(rate), Burst: 1})
	var opts []worker.Option
	if events != nil {
		opts = append(opts, worker.WithObserver(events))
	}
	th := asynqtest.NewThrottler(t, tg, []worker.Rule{worker.Rate("partner", worker.Type("sync"), limiter, worker.KeyBy(worker.ByType()))}, opts...)
	// The scheduler plans around the workers' asynq settings.
	var cfg asynq.Config
	th.Configure(&cfg)
	return th
}

// TestPaceSpreadsABatch: 500 tasks paced at 100/s are planned over 5 s, one
// slot each 10 ms, none earlier than the policy allows; workers with the
// same rule then run them with at most 1% throttled on arrival, admitted
// at their slots (no second on the Redis clock holds more than 101) and
// started within StartJitter of them.
func TestPaceSpreadsABatch(t *testing.T) {
	tg := redistest.New(t)
	var seen asynqtest.Events
	th := pacingThrottler(t, tg, 100, &seen)
	var log asynqtest.RunLog
	// Workers with the same rule are running when the batch is paced.
	f := asynqtest.NewFleet(t, tg, 2, 30, th, log.Handler(0))
	tasks := make([]*asynq.Task, 500)
	for i := range tasks {
		tasks[i] = asynq.NewTask("sync", []byte(fmt.Sprintf(`{"customer":%d}`, i)))
	}
	before := time.Now()
	planned, err := scheduler.Pace(context.Background(), f.Client, th, "nightly", tasks, scheduler.TaskOptions(asynq.Queue(f.Queue)))
	if err != nil {
		t.Fatal(err)
	}
	if len(planned) != 500 {
		t.Fatalf("%d tasks planned, want 500", len(planned))
	}
	// One slot every 10 ms: none earlier than the policy allows, and so no
	// one-second window with more than 100 (+1 for the burst).
	for i := 1; i < len(planned); i++ {
		if gap := planned[i].StartAt.Sub(planned[i-1].StartAt); gap < 10*time.Millisecond {
			t.Fatalf("tasks %d and %d planned %s apart; the policy allows one per 10 ms", i-1, i, gap)
		}
	}
	// Slots are spaced exactly (StartAt keeps the Redis clock's spacing),
	// so the span is 4.99 s unless booking fell behind the rate: a task
	// booked late gets a slot no sooner than a lead after its booking, and
	// the span grows by how far the bookings fell behind, never by more
	// than the whole time booking took.
	span, booking := planned[499].StartAt.Sub(planned[0].StartAt), time.Since(before)
	if ideal := 4990 * time.Millisecond; span < ideal || span > ideal+booking {
		t.Fatalf("500 tasks at 100/s planned over %s (booked in %s); want 4.99 s, plus at most the booking time", span, booking)
	}
	if planned[0].StartAt.Before(before) || planned[0].ID != "nightly:000000000" || !planned[0].Enqueued {
		t.Fatalf("first task planned %+v", planned[0])
	}
	// The workers process them, admitted on arrival.
	var ids []string
	for _, p := range planned {
		ids = append(ids, p.ID)
	}
	info := f.WaitDone(t, &log, 500, 60*time.Second)
	asynqtest.CheckOnce(t, log.Snapshot(), ids)
	if info.Archived != 0 || info.Failed != 0 {
		t.Fatalf("%d archived, %d failed", info.Archived, info.Failed)
	}
	if throttled := seen.Count(worker.Rescheduled); throttled > 5 {
		t.Fatalf("%d of 500 paced tasks were throttled on arrival; want at most 1%%; events %v", throttled, seen.ByKind())
	}
	// They start at their slots: no second holds more than the policy's
	// 100 and its burst of 1 on the Redis clock, and each handler starts
	// within StartJitter of its slot.
	runs := log.Snapshot()
	asynqtest.CheckHeld(t, runs, seen.Slots(), redistest.ClockOffset(t, tg.Client), time.Second, 101)
	t.Logf("events %v; ran over %s, planned over %s, booked in %s", seen.ByKind(),
		runs[len(runs)-1].At.Sub(runs[0].At), span, booking)
}

// TestDeliverAtSlot: asynq's ProcessAt is each task's slot, so asynq's own
// view of the batch holds the policy: at most 100 (+1) due in any second,
// and none due before its slot's second.
func TestDeliverAtSlot(t *testing.T) {
	tg := redistest.New(t)
	th := pacingThrottler(t, tg, 100, nil)
	f := asynqtest.NewFleet(t, tg, 0, 0, th, nil)
	tasks := make([]*asynq.Task, 500)
	for i := range tasks {
		tasks[i] = asynq.NewTask("sync", nil)
	}
	planned, err := scheduler.Pace(context.Background(), f.Client, th, "at-slot", tasks,
		scheduler.DeliverAtSlot(), scheduler.TaskOptions(asynq.Queue(f.Queue)))
	if err != nil {
		t.Fatal(err)
	}
	slotOf := map[string]time.Time{}
	for _, p := range planned {
		slotOf[p.ID] = p.StartAt
	}
	perSecond := map[int64]int{}
	for _, info := range tasksIn(t, f.Inspector, f.Queue) {
		if info.State == asynq.TaskStateScheduled {
			if due, slot := info.NextProcessAt, slotOf[info.ID]; due.Unix() != slot.Unix() {
				t.Errorf("task %s due %s, its slot %s", info.ID, due, slot)
			}
		}
		perSecond[info.NextProcessAt.Unix()]++
	}
	for sec, n := range perSecond {
		if n > 101 {
			t.Errorf("%d tasks due in the second %d", n, sec)
		}
	}
}

// TestPaceAgainRunsNothingTwice: a batch whose tasks have all run, paced
// again with the same ID (a crash before Pace returned, a replica taking
// a tick over), enqueues none of them again: asynq keeps a done task for
// a day, and its ID with it. (asynq deletes a task that succeeds; its ID
// was then free, and the batch ran twice.)
func TestPaceAgainRunsNothingTwice(t *testing.T) {
	tg := redistest.New(t)
	th := pacingThrottler(t, tg, 20, nil)
	var log asynqtest.RunLog
	f := asynqtest.NewFleet(t, tg, 1, 5, th, log.Handler(0))
	tasks := []*asynq.Task{asynq.NewTask("sync", []byte("a")), asynq.NewTask("sync", []byte("b")), asynq.NewTask("sync", []byte("c"))}
	pace := func() []scheduler.Planned {
		t.Helper()
		planned, err := scheduler.Pace(context.Background(), f.Client, th, "nightly", tasks, scheduler.TaskOptions(asynq.Queue(f.Queue)))
		if err != nil {
			t.Fatal(err)
		}
		return planned
	}
	pace()
	f.WaitDone(t, &log, len(tasks), 10*time.Second)
	for i, p := range pace() {
		if p.Enqueued {
			t.Errorf("task %d, done, was enqueued again: %+v", i, p)
		}
	}
	if waiting := tasksIn(t, f.Inspector, f.Queue); len(waiting) > 0 || log.Count() != len(tasks) {
		t.Fatalf("%d tasks waiting to run again, %d runs of %d tasks; want none waiting, each run once", len(waiting), log.Count(), len(tasks))
	}
}

// TestPaceAgainTakesNothingTwice: running the same batch again, after a
// crash say, neither enqueues a task twice nor books its slots again.
func TestPaceAgainTakesNothingTwice(t *testing.T) {
	tg := redistest.New(t)
	th := pacingThrottler(t, tg, 10, nil)
	f := asynqtest.NewFleet(t, tg, 0, 0, th, nil)
	tasks := []*asynq.Task{asynq.NewTask("sync", []byte("a")), asynq.NewTask("sync", []byte("b")), asynq.NewTask("sync", []byte("c"))}
	first, err := scheduler.Pace(context.Background(), f.Client, th, "b1", tasks[:2], scheduler.TaskOptions(asynq.Queue(f.Queue)))
	if err != nil {
		t.Fatal(err)
	}
	again, err := scheduler.Pace(context.Background(), f.Client, th, "b1", tasks, scheduler.TaskOptions(asynq.Queue(f.Queue)))
	if err != nil {
		t.Fatal(err)
	}
	for i := range first {
		if again[i].Enqueued || again[i].StartAt.Sub(first[i].StartAt).Abs() > 50*time.Millisecond {
			t.Fatalf("task %d: first %+v, again %+v; want the same slot, not enqueued twice", i, first[i], again[i])
		}
	}
	if !again[2].Enqueued || again[2].StartAt.Sub(first[1].StartAt) < 90*time.Millisecond {
		t.Fatalf("the new third task: %+v; want it enqueued one slot after the second (%s)", again[2], first[1].StartAt)
	}
	if n := len(tasksIn(t, f.Inspector, f.Queue)); n != 3 {
		t.Fatalf("%d tasks in the queue, want 3", n)
	}
}

func TestPaceStopsBeyondBookAhead(t *testing.T) {
	tg := redistest.New(t)
	th := pacingThrottler(t, tg, 10, nil)
	f := asynqtest.NewFleet(t, tg, 0, 0, th, nil)
	tasks := make([]*asynq.Task, 30)
	for i := range tasks {
		tasks[i] = asynq.NewTask("sync", nil)
	}
	// 10/s with at most 3 s ahead, the first slot a lead (1.4 s) out:
	// slots at 1.4 s, 1.5 s, ... 3.0 s fit, 17 of them.
	// "At most 3 s ahead" counts from each booking: a machine too slow to
	// book them all at once fits one more slot per 100 ms it took.
	start := time.Now()
	planned, err := scheduler.Pace(context.Background(), f.Client, th, "big", tasks, scheduler.BookAhead(3*time.Second), scheduler.TaskOptions(asynq.Queue(f.Queue)))
	most := 17 + int(time.Since(start)/(100*time.Millisecond))
	if !errors.Is(err, worker.ErrThrottled) || len(planned) < 16 || len(planned) > most {
		t.Fatalf("%d planned, %v; want 16 to %d and an error wrapping ErrThrottled", len(planned), err, most)
	}
}
