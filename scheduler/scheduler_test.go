package scheduler_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/scheduler"
	"github.com/redis/go-redis/v9"
)

var quiet = scheduler.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))

// queueOf returns a queue name of the test's own and deletes it at the end.
func queueOf(t *testing.T, tg *redistest.Target) (string, *asynq.Inspector) {
	t.Helper()
	queue := "q-" + tg.Prefix[len(tg.Prefix)-9:len(tg.Prefix)-1]
	inspector := asynq.NewInspectorFromRedisClient(tg.NewClient(t))
	t.Cleanup(func() { _ = inspector.DeleteQueue(queue, true) })
	return queue, inspector
}

// tasksIn lists the IDs of every task waiting in queue.
func tasksIn(t *testing.T, inspector *asynq.Inspector, queue string) []*asynq.TaskInfo {
	t.Helper()
	var all []*asynq.TaskInfo
	for _, list := range []func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){inspector.ListPendingTasks, inspector.ListScheduledTasks} {
		for page := 1; ; page++ {
			infos, err := list(queue, asynq.PageSize(1000), asynq.Page(page))
			if err != nil && !errors.Is(err, asynq.ErrQueueNotFound) {
				t.Fatal(err)
			}
			all = append(all, infos...)
			if len(infos) < 1000 {
				break
			}
		}
	}
	return all
}

// TestTicksFireOnceAcrossReplicas: three replicas run an entry firing every
// second, on a clock the test drives, for six ticks; each tick's batch is
// enqueued exactly once, no tick is missed, and stopping one replica midway
// changes nothing.
func TestTicksFireOnceAcrossReplicas(t *testing.T) {
	tg := redistest.New(t)
	queue, inspector := queueOf(t, tg)
	var mu sync.Mutex
	producedBy := map[string][]int{} // tick → replicas that produced it
	var replicas []*scheduler.Scheduler
	for r := range 3 {
		s, err := scheduler.New(tg.NewClient(t), scheduler.WithPrefix(tg.Prefix), quiet)
		if err != nil {
			t.Fatal(err)
		}
		err = s.Add("reminders", "* * * * * *", scheduler.Batch(func(ctx context.Context) ([]*asynq.Task, error) {
			at, ok := scheduler.TickTime(ctx)
			if !ok {
				return nil, errors.New("no tick in the producer's context")
			}
			tick := at.UTC().Format(time.RFC3339)
			mu.Lock()
			producedBy[tick] = append(producedBy[tick], r)
			mu.Unlock()
			var batch []*asynq.Task
			for i := range 3 {
				batch = append(batch, asynq.NewTask("remind", []byte(fmt.Sprint(tick, i))))
			}
			return batch, nil
		}), scheduler.TaskOptions(asynq.Queue(queue)))
		if err != nil {
			t.Fatal(err)
		}
		replicas = append(replicas, s)
	}
	clock := newFakeClock(t, nil, time.Now().Truncate(time.Second), replicas...)
	for _, s := range replicas {
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
	}
	// Each replica waits for its first tick and its first look for lapsed
	// ticks; after that a loop woken late still fires every tick it passed.
	eventually(t, "every replica waiting for its first tick", func() bool { return clock.Waiting() == 2*len(replicas) })
	for i := 1; i <= 6; i++ {
		clock.Advance(time.Second)
		eventually(t, fmt.Sprintf("tick %d's batch enqueued", i), func() bool { return len(tasksIn(t, inspector, queue)) == 3*i })
		if i == 3 {
			if err := replicas[0].Stop(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, s := range replicas[1:] {
		if err := s.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
	}

	// Every tick's batch is in asynq once: 3 tasks per tick, IDs unique.
	perTick := map[string]int{}
	for _, info := range tasksIn(t, inspector, queue) {
		rest, ok := strings.CutPrefix(info.ID, "reminders@")
		colon := strings.LastIndexByte(rest, ':')
		if !ok || colon < 0 {
			t.Fatalf("task ID %q is not <entry>@<tick>:<index>", info.ID)
		}
		perTick[rest[:colon]]++
	}
	var ticks []time.Time
	for at, n := range perTick {
		if n != 3 {
			t.Errorf("tick %s has %d tasks, want 3", at, n)
		}
		tick, err := time.Parse(time.RFC3339Nano, at)
		if err != nil {
			t.Fatal(err)
		}
		ticks = append(ticks, tick)
	}
	sort.Slice(ticks, func(i, j int) bool { return ticks[i].Before(ticks[j]) })
	if len(ticks) != 6 {
		t.Fatalf("%d ticks, want 6: %v", len(ticks), ticks)
	}
	for i := 1; i < len(ticks); i++ {
		if gap := ticks[i].Sub(ticks[i-1]); gap != time.Second {
			t.Errorf("ticks %s and %s: a tick is missing", ticks[i-1], ticks[i])
		}
	}
	mu.Lock()
	defer mu.Unlock()
	usedAfterStop := false
	for tick, by := range producedBy {
		if len(by) != 1 {
			t.Errorf("tick %s was produced by replicas %v", tick, by)
		}
		usedAfterStop = usedAfterStop || (len(by) == 1 && by[0] != 0)
	}
	if !usedAfterStop {
		t.Errorf("no tick was produced by the replicas still running: %v", producedBy)
	}
}

// reported collects the failures a scheduler reports.
type reported struct {
	mu   sync.Mutex
	errs []*scheduler.EntryError
}

// option has the scheduler report its failures to r.
func (r *reported) option() scheduler.Option {
	return scheduler.WithErrorHandler(func(e *scheduler.EntryError) {
		r.mu.Lock()
		r.errs = append(r.errs, e)
		r.mu.Unlock()
	})
}

// all returns the failures reported so far.
func (r *reported) all() []*scheduler.EntryError {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.errs)
}

func TestFailingEntriesAreReportedAndOthersGoOn(t *testing.T) {
	tg := redistest.New(t)
	queue, inspector := queueOf(t, tg)
	var failures reported
	s, err := scheduler.New(tg.Client, scheduler.WithPrefix(tg.Prefix), quiet, failures.option())
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("partner API down")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(s.Add("failing", "* * * * * *", scheduler.Batch(func(context.Context) ([]*asynq.Task, error) { return nil, boom })))
	must(s.Add("panicking", "* * * * * *", scheduler.Batch(func(context.Context) ([]*asynq.Task, error) { panic("nil map") })))
	must(s.Add("good", "* * * * * *", scheduler.Batch(func(context.Context) ([]*asynq.Task, error) {
		return []*asynq.Task{asynq.NewTask("ok", nil)}, nil
	}), scheduler.TaskOptions(asynq.Queue(queue))))
	clock := newFakeClock(t, nil, time.Now().Truncate(time.Second), s)
	must(s.Start())
	eventually(t, "the entries waiting for their first tick", func() bool { return clock.Waiting() == 6 })
	clock.Advance(time.Second)
	clock.Advance(time.Second)
	eventually(t, "two ticks of every entry done", func() bool {
		return len(failures.all()) >= 4 && len(tasksIn(t, inspector, queue)) >= 2
	})
	must(s.Stop(context.Background()))

	var failed, panicked int
	for _, f := range failures.all() {
		switch {
		case f.Entry == "failing" && errors.Is(f, boom):
			failed++
		case f.Entry == "panicking" && errors.Is(f, scheduler.ErrProducerPanicked) && strings.Contains(f.Error(), "nil map"):
			panicked++
		default:
			t.Errorf("unexpected failure: %v", f)
		}
	}
	if failed < 2 || panicked < 2 {
		t.Fatalf("%d failures and %d panics reported over two ticks; want each tick's", failed, panicked)
	}
	if n := len(tasksIn(t, inspector, queue)); n < 2 {
		t.Fatalf("the good entry enqueued %d tasks alongside its failing neighbours", n)
	}
}

// TestATaskNoRunCouldEnqueueEndsItsTick: a batch with a task asynq cannot
// take (no type) is reported once and its tick ends, the tasks before it
// enqueued; another replica does not run it again every look for lapsed
// ticks (it once did, for a day). A batch cut short by Redis is, as
// TestAStoppedTicksBatchIsFinishedElsewhere shows.
func TestATaskNoRunCouldEnqueueEndsItsTick(t *testing.T) {
	tg := redistest.New(t)
	queue, inspector := queueOf(t, tg)
	var failures reported
	var runs atomic.Int32
	s, err := scheduler.New(tg.Client, scheduler.WithPrefix(tg.Prefix), quiet, failures.option())
	if err != nil {
		t.Fatal(err)
	}
	err = s.Add("nightly", "@every 1h", scheduler.Batch(func(context.Context) ([]*asynq.Task, error) {
		runs.Add(1)
		return []*asynq.Task{asynq.NewTask("sync", nil), asynq.NewTask(" ", nil), asynq.NewTask("sync", []byte("after"))}, nil
	}), scheduler.TaskOptions(asynq.Queue(queue)))
	if err != nil {
		t.Fatal(err)
	}
	hour := time.Now().Truncate(time.Hour).Add(time.Hour)
	clock := newFakeClock(t, nil, hour.Add(-time.Second), s)
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the entry waiting", func() bool { return clock.Waiting() == 2 })
	clock.Advance(time.Second)
	eventually(t, "the failure reported", func() bool { return len(failures.all()) == 1 })
	for range 3 {
		clock.Advance(scheduler.RecoverEvery)
		eventually(t, "the look for lapsed ticks waiting again", func() bool { return clock.Waiting() == 2 })
	}
	if err := s.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := failures.all(); runs.Load() != 1 || len(got) != 1 || !strings.Contains(got[0].Error(), "a task asynq cannot take") {
		t.Fatalf("%d runs, failures %v; want one run and its one failure", runs.Load(), got)
	}
	if n := len(tasksIn(t, inspector, queue)); n != 1 {
		t.Fatalf("%d tasks enqueued; want the one before the task of no type", n)
	}
}

func TestStopCancelsProducersAndWaits(t *testing.T) {
	tg := redistest.New(t)
	s, err := scheduler.New(tg.Client, scheduler.WithPrefix(tg.Prefix), quiet)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{}, 1)
	var sawCancel atomic.Bool
	var returned atomic.Bool
	err = s.Add("slow", "* * * * * *", scheduler.Stream(func(ctx context.Context, emit func(*asynq.Task) error) error {
		select {
		case started <- struct{}{}:
		default:
		}
		<-ctx.Done()
		sawCancel.Store(errors.Is(ctx.Err(), context.Canceled))
		time.Sleep(100 * time.Millisecond) // tidying up
		returned.Store(true)
		return ctx.Err()
	}))
	if err != nil {
		t.Fatal(err)
	}
	clock := newFakeClock(t, nil, time.Now(), s)
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the entry waiting for its tick", func() bool { return clock.Waiting() == 2 })
	clock.Advance(time.Second)
	<-started
	if err := s.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !sawCancel.Load() || !returned.Load() {
		t.Fatal("Stop returned before the running producer saw its context cancelled and returned")
	}
	if err := s.Start(); !errors.Is(err, scheduler.ErrStarted) {
		t.Fatalf("Start after Stop: %v", err)
	}
}

func TestStopHonoursItsContext(t *testing.T) {
	tg := redistest.New(t)
	s, _ := scheduler.New(tg.Client, scheduler.WithPrefix(tg.Prefix), quiet)
	started := make(chan struct{}, 1)
	release := make(chan struct{}, 1)
	_ = s.Add("stubborn", "* * * * * *", scheduler.Stream(func(ctx context.Context, emit func(*asynq.Task) error) error {
		select {
		case started <- struct{}{}:
		default:
		}
		<-release // ignores its context
		return nil
	}))
	clock := newFakeClock(t, nil, time.Now(), s)
	_ = s.Start()
	eventually(t, "the entry waiting for its tick", func() bool { return clock.Waiting() == 2 })
	clock.Advance(time.Second)
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := s.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop with a producer that never returns: %v", err)
	}
	// Stop again waits again: a shutdown that tries once more, longer.
	again, cancelAgain := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancelAgain()
	if err := s.Stop(again); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop again, the producer still running: %v; want it to wait again", err)
	}
	release <- struct{}{}
	if err := s.Stop(context.Background()); err != nil {
		t.Fatalf("Stop once the producer returned: %v", err)
	}
}

func TestAddRejectsBadEntries(t *testing.T) {
	tg := redistest.Embedded(t)
	s, err := scheduler.New(tg.Client, quiet)
	if err != nil {
		t.Fatal(err)
	}
	ok := scheduler.Batch(func(context.Context) ([]*asynq.Task, error) { return nil, nil })
	for _, tc := range []struct {
		name, spec string
		producer   scheduler.Producer
		opts       []scheduler.BatchOption
	}{
		{"", "* * * * *", ok, nil},
		{"x", "* * * * *", nil, nil},
		{"x", "* * * * *", scheduler.Batch(nil), nil},
		{"x", "61 * * * *", ok, nil},
		{"x", "not a spec", ok, nil},
		{"x", "CRON_TZ=Nowhere/Atlantis 0 2 * * *", ok, nil},
		{"x", "* * * * *", ok, []scheduler.BatchOption{nil}},
		{"x", "* * * * *", ok, []scheduler.BatchOption{scheduler.BookAhead(0)}},
		{"x", "* * * * *", ok, []scheduler.BatchOption{scheduler.PacedBy(nil)}},
	} {
		if err := s.Add(tc.name, tc.spec, tc.producer, tc.opts...); !errors.Is(err, scheduler.ErrInvalidEntry) {
			t.Errorf("Add(%q, %q): %v, want ErrInvalidEntry", tc.name, tc.spec, err)
		}
	}
	for _, spec := range []string{"*/5 * * * * *", "0 2 * * *", "CRON_TZ=Europe/Berlin 0 2 * * *", "@hourly", "@every 90s"} {
		if err := s.Add("entry "+spec, spec, ok); err != nil {
			t.Errorf("Add(%q): %v", spec, err)
		}
	}
	if err := s.Add("entry @hourly", "@daily", ok); !errors.Is(err, scheduler.ErrInvalidEntry) {
		t.Errorf("a second entry of the same name: %v", err)
	}
	for _, client := range []redis.UniversalClient{nil, (*redis.Client)(nil), (*redis.ClusterClient)(nil)} {
		if _, err := scheduler.New(client); !errors.Is(err, scheduler.ErrInvalidOption) {
			t.Errorf("New(%T(nil)): %v; want ErrInvalidOption", client, err)
		}
	}
	for _, opt := range []scheduler.Option{nil, scheduler.WithPrefix("{"), scheduler.WithLogger(nil), scheduler.WithLocation(nil)} {
		if _, err := scheduler.New(tg.Client, opt); !errors.Is(err, scheduler.ErrInvalidOption) {
			t.Errorf("a bad option: %v; want ErrInvalidOption", err)
		}
	}
	_ = s.Start()
	defer s.Stop(context.Background())
	if err := s.Add("late", "* * * * *", ok); !errors.Is(err, scheduler.ErrStarted) {
		t.Errorf("Add after Start: %v", err)
	}
}
