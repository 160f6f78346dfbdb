package worker_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
)

// leasedFleet starts processes asynq servers of 10 workers, each behind a
// Throttler and a limiter of its own (as separate processes have), on a
// client of its own whose commands are counted: policy with leased shares,
// one limit per task type.
func leasedFleet(t *testing.T, tg *redistest.Target, processes int, policy throttle.Policy, log *asynqtest.RunLog, seen worker.Observer) (*asynqtest.Fleet, *roundTrips, *leasedCount) {
	t.Helper()
	trips := &roundTrips{}
	decisions := &leasedCount{trips: trips, warm: 250 * time.Millisecond}
	var f *asynqtest.Fleet
	for range processes {
		client := tg.NewClient(t)
		client.AddHook(trips)
		l, err := throttle.New(client, "leased", policy, throttle.WithPrefix(tg.Prefix), throttle.WithLeasedShares(0), throttle.WithObserver(decisions))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		th, err := worker.New(client, []worker.Rule{worker.Rate("leased", worker.Type("sync"), l, worker.KeyBy(worker.ByType()))},
			worker.WithPrefix(tg.Prefix), worker.WithObserver(seen), worker.WithLogger(nil))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = th.Close(context.Background()) })
		if f == nil {
			f = asynqtest.NewFleet(t, tg, 0, 0, th, nil)
		}
		f.AddServer(t, 10, th, log.Handler(0))
	}
	return f, trips, decisions
}

// admitTimes records when each task was admitted, on this process's
// clock, and passes every event on. Safe for concurrent use.
type admitTimes struct {
	asynqtest.Events
	mu sync.Mutex
	at map[string]time.Time
}

func (a *admitTimes) Observe(ctx context.Context, e worker.Event) {
	if e.Kind == worker.Admitted || e.Kind == worker.WaitedInline {
		now := time.Now()
		a.mu.Lock()
		if a.at == nil {
			a.at = map[string]time.Time{}
		}
		a.at[e.TaskID] = now
		a.mu.Unlock()
	}
	a.Events.Observe(ctx, e)
}

// latest returns the longest time from a task's admission to its
// handler's start.
func (a *admitTimes) latest(runs []asynqtest.Run) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	var most time.Duration
	for _, r := range runs {
		if at, ok := a.at[r.TaskID]; ok {
			most = max(most, r.At.Sub(at))
		}
	}
	return most
}

// leasedCount counts a limiter's Allow decisions, and those made in
// memory under a leased share; from warm after its first decision on, it
// counts them apart, with the commands trips counted meanwhile. Safe for
// concurrent use.
type leasedCount struct {
	all, leased atomic.Int64
	warm        time.Duration
	trips       *roundTrips
	mu          sync.Mutex
	first       time.Time
	warmed      bool
	// at the moment warm had passed: decisions, those in memory, commands
	atAll, atLeased, atTrips int64
}

func (c *leasedCount) ObserveDecision(_ context.Context, d throttle.Decision) {
	if d.Op != throttle.OpAllow {
		return
	}
	c.mu.Lock()
	now := time.Now()
	if c.first.IsZero() {
		c.first = now
	}
	if !c.warmed && now.Sub(c.first) >= c.warm {
		c.warmed = true
		c.atAll, c.atLeased, c.atTrips = c.all.Load(), c.leased.Load(), c.trips.n.Load()
	}
	c.mu.Unlock()
	c.all.Add(1)
	if d.Leased {
		c.leased.Add(1)
	}
}

// past reports whether warm and extra have passed since the first decision.
func (c *leasedCount) past(extra time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.first.IsZero() && time.Since(c.first) >= c.warm+extra
}

// sinceWarm returns the decisions, those in memory and the commands
// counted since warm had passed.
func (c *leasedCount) sinceWarm() (all, leased, trips int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.all.Load() - c.atAll, c.leased.Load() - c.atLeased, c.trips.n.Load() - c.atTrips
}

// runAll enqueues n tasks of type sync at once, waits until all have run,
// and checks that each ran exactly once and none was archived or failed.
func runAll(t *testing.T, f *asynqtest.Fleet, log *asynqtest.RunLog, n int) []asynqtest.Run {
	t.Helper()
	var ids []string
	for i := range n {
		ids = append(ids, f.Enqueue(t, "sync", map[string]int{"n": i}))
	}
	info := f.WaitDone(t, log, n, 60*time.Second)
	runs := log.Snapshot()
	asynqtest.CheckOnce(t, runs, ids)
	if info.Archived != 0 || info.Failed != 0 {
		t.Errorf("queue after the run: %d archived, %d failed; want 0 and 0", info.Archived, info.Failed)
	}
	return runs
}

// leasedStartJitter is how many more starts than the policy allows a
// window of handler starts may hold: admissions are made in memory on
// each process's clock, and a handler starts a moment after its
// admission, later on a busy machine. A second of starts may so hold the
// admissions of a second and this much more: 100 ms at 50/s, 5 units.
// (TestLeasedRuleHoldsTheRateAcrossAFleet measures it: admission to start
// at most 0.3 ms here, 3.8 ms with two busy loops on both cores.)
const leasedStartJitter = 5

// TestLeasedRuleHoldsTheRateAcrossAFleet: three processes' asynq servers
// run 400 tasks under one GCRA of 50/s (burst 5) with leased shares, all
// enqueued at once. Every task runs exactly once, none is archived or
// failed; no second holds more starts than the policy allows (50 and the
// burst of 5, with leasedStartJitter); and while the backlog lasts (from
// the third second to the sixth; the third process's share comes a lease
// after the first two's) the fleet starts at least 90% of the rate.
func TestLeasedRuleHoldsTheRateAcrossAFleet(t *testing.T) {
	tg := redistest.New(t)
	var log asynqtest.RunLog
	var seen admitTimes
	f, trips, _ := leasedFleet(t, tg, 3, throttle.GCRA{Rate: throttle.PerSecond(50), Burst: 5}, &log, &seen)
	const tasks = 400
	runs := runAll(t, f, &log, tasks)
	most := asynqtest.MostInAnyWindow(runs, time.Second)
	if most > 50+5+leasedStartJitter {
		t.Errorf("%d starts within one second; the policy allows 55 (50/s and a burst of 5), %d more for start jitter", most, leasedStartJitter)
	}
	first, last := runs[0].At, runs[len(runs)-1].At
	perSecond := make([]int, int(last.Sub(first)/time.Second)+1)
	for _, r := range runs {
		perSecond[int(r.At.Sub(first)/time.Second)]++
	}
	if len(perSecond) < 6 {
		t.Fatalf("400 tasks at 50/s ran within %s: above the rate", last.Sub(first))
	}
	steady := float64(perSecond[2]+perSecond[3]+perSecond[4]+perSecond[5]) / 4
	if steady < 0.9*50 {
		t.Errorf("from the third second to the sixth, %.1f starts a second; want at least 45 (90%% of 50/s)", steady)
	}
	t.Logf("figures: %d tasks in %s; starts in each second %v, %.1f/s from the third to the sixth (policy 50/s); most in any second %d (allowed 55 + %d); "+
		"admission to start at most %s; %.2f library commands a task; events %v",
		tasks, last.Sub(first), perSecond, steady, most, leasedStartJitter, seen.latest(runs), float64(trips.n.Load())/tasks, seen.ByKind())
}

// TestLeasedRuleCostsLittleWhenItNeverBinds: three processes' asynq
// servers run 3,000 tasks (handlers that return at once) under one GCRA
// far above the load (100,000/s, burst 1,000) with leased shares,
// enqueued one after another, and more until 100 ms past a quarter second
// after the first decision (on redis-server 3,000 may run in less). Every
// task runs exactly once and none is throttled. A key is decided in Redis
// until its first share comes, a 64th of a lease (23 ms) after its
// first decision; from a quarter second on, at most 1% of the decisions
// are made in Redis, and all the processes' commands to Redis through the
// library's clients (renewals, the PINGs before asynq records an
// outcome, those decisions) come to at most 0.15 a task. (Measured: every
// decision from then on in memory, and 0.03 commands a task on miniredis,
// where 3,000 tasks take 3-7 s, 0.002-0.003 on redis-server, where they
// take half a second; the renewals and PINGs come at a steady rate a
// second, so a slower machine runs fewer tasks for each.)
func TestLeasedRuleCostsLittleWhenItNeverBinds(t *testing.T) {
	tg := redistest.New(t)
	var log asynqtest.RunLog
	var seen asynqtest.Events
	f, trips, decisions := leasedFleet(t, tg, 3, throttle.GCRA{Rate: throttle.PerSecond(100_000), Burst: 1000}, &log, &seen)
	const tasks = 3000
	var ids []string
	for i := 0; i < tasks || !decisions.past(100*time.Millisecond); i++ {
		ids = append(ids, f.Enqueue(t, "sync", map[string]int{"n": i}))
	}
	info := f.WaitDone(t, &log, len(ids), 60*time.Second)
	runs := log.Snapshot()
	asynqtest.CheckOnce(t, runs, ids)
	if info.Archived != 0 || info.Failed != 0 {
		t.Errorf("queue after the run: %d archived, %d failed; want 0 and 0", info.Archived, info.Failed)
	}
	if n := seen.Count(worker.WaitedInline) + seen.Count(worker.Rescheduled); n > 0 {
		t.Errorf("%d tasks throttled under a limit far above the load", n)
		for _, e := range seen.All() {
			if e.Kind == worker.WaitedInline || e.Kind == worker.Rescheduled {
				t.Logf("%+v", e)
			}
		}
	}
	all, leased, commands := decisions.sinceWarm()
	if inRedis := all - leased; all == 0 || float64(inRedis) > 0.01*float64(all) {
		t.Errorf("from a quarter second on, %d of %d decisions made in Redis; want at most 1%%", inRedis, all)
	}
	perTask := float64(commands) / float64(max(all, 1))
	if perTask > 0.15 {
		t.Errorf("from a quarter second on, %.3f library commands a task; want at most 0.15", perTask)
	}
	t.Logf("figures: %d tasks in %s; from a quarter second on, %d of %d decisions in memory and %.3f library commands a task (%.3f over the whole run); events %v",
		len(ids), runs[len(runs)-1].At.Sub(runs[0].At), leased, all, perTask, float64(trips.n.Load())/float64(len(ids)), seen.ByKind())
}

// TestLeasedUnitsGoBackWhenAnotherRuleRefuses: a task admitted in memory
// by a rule of leased shares and then refused by a window gives its units
// back to the share: after one task runs and three are refused, the share
// holds one unit less than before, not four.
func TestLeasedUnitsGoBackWhenAnotherRuleRefuses(t *testing.T) {
	tg := redistest.New(t)
	ctx := context.Background()
	// 100 units that refill at one a minute: what the share holds moves
	// only by what the tasks take.
	leased, err := throttle.New(tg.Client, "leased", throttle.GCRA{Rate: throttle.PerMinute(1), Burst: 100},
		throttle.WithPrefix(tg.Prefix), throttle.WithLeasedShares(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = leased.Close(ctx) })
	window, err := throttle.New(tg.Client, "window", throttle.FixedWindow{Limit: 1, Window: redistest.FarWindow}, throttle.WithPrefix(tg.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	th := asynqtest.NewThrottler(t, tg, []worker.Rule{
		worker.Rate("leased", worker.AnyTask(), leased, worker.KeyBy(worker.Constant("all"))),
		worker.Rate("window", worker.AnyTask(), window, worker.KeyBy(worker.Constant("all"))),
	})
	// Demand enough for a share: ten units asked over a tenth of a second,
	// then wait for the share to come.
	for range 10 {
		if _, err := leased.Allow(ctx, "all"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	var before throttle.Result
	for deadline := time.Now().Add(5 * time.Second); !before.Leased; {
		if time.Now().After(deadline) {
			t.Fatal("no share within 5 s")
		}
		time.Sleep(20 * time.Millisecond)
		if before, err = leased.Peek(ctx, "all"); err != nil {
			t.Fatal(err)
		}
	}
	h := th.Middleware(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil }))
	var ran, refused int
	for range 4 {
		err := h.ProcessTask(ctx, asynq.NewTask("job", nil))
		var throttled *worker.ThrottledError
		switch {
		case err == nil:
			ran++
		case errors.As(err, &throttled) && throttled.Rule == "window":
			refused++
		default:
			t.Fatalf("a task returned %v; want it run, or throttled by the window", err)
		}
	}
	after, err := leased.Peek(ctx, "all")
	if err != nil || !after.Leased {
		t.Fatalf("after the tasks: %+v, %v; want the share still held", after, err)
	}
	if ran != 1 || refused != 3 {
		t.Fatalf("%d ran and %d were refused; want 1 and 3", ran, refused)
	}
	if before.Remaining-after.Remaining != 1 {
		t.Errorf("the share held %d units before and %d after one task ran and three were refused; want one less", before.Remaining, after.Remaining)
	}
}
