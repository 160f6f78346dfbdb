package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
)

// The three tests of this file each start a redis-server of their own, stop
// it and start it again, and assert what was lost, duplicated or archived
// and that a block outlived the outage, never a rate: they run side by side
// (t.Parallel), after the package's other tests, which measure rates and
// run alone. Together they take about 40 s instead of 60 s in each pass.

// TestReliabilityFleetAcrossRedisRestart: a fleet of two asynq servers
// works through 120 throttled tasks, a third of them with no retries left
// (MaxRetry(0): asynq archives such a task on any returned error). After 30
// have run, the partner's key is blocked for 4 s (a 429's Retry-After), the
// workers' tasks wait for it in their handlers, and Redis, with its
// append-only file synced on every write, is killed and started again a
// second later. The block outlives the restart (no task runs until it
// ends), and then every task runs exactly once; none is lost or archived.
//
// The kill lands while the workers wait in their handlers, when no write of
// asynq's own is in flight: a kill in the middle of asynq's write of a
// task's outcome can make asynq run that task again after its lease (asynq
// is at-least-once; see docs/reliability.md), which no middleware can prevent.
func TestReliabilityFleetAcrossRedisRestart(t *testing.T) {
	t.Parallel() // see the note above TestReliabilityFleetAcrossRedisRestart
	srv := redistest.StartServer(t, redistest.ServerOptions{AOF: true})
	tg := srv.Target(t)
	limiter, err := throttle.New(tg.NewClient(t), "limiter", throttle.GCRA{Rate: throttle.PerSecond(20), Burst: 1},
		throttle.WithPrefix(tg.Prefix), throttle.WithTimeout(time.Second), throttle.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	var seen asynqtest.Events
	th := asynqtest.NewThrottler(t, tg, []worker.Rule{worker.Rate("sync", worker.Type("partner:sync"), limiter, worker.KeyBy(worker.ByType()))},
		worker.WithObserver(&seen), worker.WithLogger(nil), worker.WithInlineWait(10*time.Second))
	var log asynqtest.RunLog
	f := asynqtest.NewFleet(t, tg, 2, 5, th, log.Handler(5*time.Millisecond))
	const tasks = 120
	ids := enqueueSome(t, f, tasks)
	for log.Count() < 30 {
		time.Sleep(10 * time.Millisecond)
	}
	ctx := context.Background()
	if err := limiter.BlockFor(ctx, "partner:sync", 4*time.Second); err != nil {
		t.Fatal(err)
	}
	blockEnds := time.Now().Add(4 * time.Second)
	time.Sleep(1500 * time.Millisecond) // the slots booked before the block pass
	before := log.Count()
	srv.Stop(t)
	stopped := time.Now()
	time.Sleep(time.Second)
	srv.Start(t)
	outage := time.Since(stopped)

	info := f.WaitDone(t, &log, tasks, 90*time.Second)
	runs := log.Snapshot()
	asynqtest.CheckOnce(t, runs, ids)
	for _, r := range runs {
		if r.At.After(stopped) && r.At.Before(blockEnds.Add(-50*time.Millisecond)) {
			t.Fatalf("a task ran at %s, before the block ended at %s: the block did not survive the restart",
				r.At.Format("15:04:05.000"), blockEnds.Format("15:04:05.000"))
		}
	}
	archived, err := f.Inspector.ListArchivedTasks(f.Queue)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("figures: %s: %d tasks (%d with MaxRetry(0)), %d run before Redis was killed during a 4s block, outage %s; "+
		"%d runs, lost 0, duplicated 0, archived %d; gate events %v",
		persisted(srv), tasks, (tasks+2)/3, before, outage.Round(100*time.Millisecond), len(runs), len(archived), seen.ByKind())
	if info.Archived != 0 || len(archived) != 0 {
		t.Fatalf("%d tasks archived across the restart", len(archived))
	}
	if before >= tasks {
		t.Fatalf("all %d tasks ran before Redis was killed: the run did not cover the restart", before)
	}
}

// TestReliabilityGateAcrossRedisOutage: Redis dies just before a window of
// FixedWindow{5 per 2s} turns over, while 15 of 20 tasks (a third with
// MaxRetry(0)) wait in their handlers for it, and comes back a second
// later. The waiting tasks ask the throttle while Redis is down: they get
// no decision, are neither failed nor archived, ask again and run once
// Redis is back; every task exactly once.
func TestReliabilityGateAcrossRedisOutage(t *testing.T) {
	t.Parallel() // see the note above TestReliabilityFleetAcrossRedisRestart
	srv := redistest.StartServer(t, redistest.ServerOptions{AOF: true})
	tg := srv.Target(t)
	limiter, err := throttle.New(tg.NewClient(t), "limiter", throttle.FixedWindow{Limit: 5, Window: 2 * time.Second},
		throttle.WithPrefix(tg.Prefix), throttle.WithTimeout(300*time.Millisecond), throttle.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	var seen asynqtest.Events
	th := asynqtest.NewThrottler(t, tg, []worker.Rule{worker.Rate("sync", worker.Type("partner:sync"), limiter, worker.KeyBy(worker.ByType()))},
		worker.WithObserver(&seen), worker.WithLogger(nil), worker.WithInlineWait(10*time.Second))
	var log asynqtest.RunLog
	const tasks = 20
	// Enqueued right after a window turned over (windows are aligned to
	// the epoch: a spent probe key tells when), so that the first five run
	// at once and finish long before Redis is killed.
	ctx := context.Background()
	if _, err := limiter.AllowN(ctx, "probe", 5); err != nil {
		t.Fatal(err)
	}
	probe, err := limiter.Allow(ctx, "probe")
	if err != nil || probe.Allowed {
		t.Fatalf("probe: %+v, %v", probe, err)
	}
	time.Sleep(probe.RetryAfter + 20*time.Millisecond)
	f := asynqtest.NewFleet(t, tg, 2, 10, th, log.Handler(5*time.Millisecond))
	ids := enqueueSome(t, f, tasks)
	// The window's five have run; the kill comes 300 ms before it turns.
	// On a machine so slow that they ran late in their window, the next
	// window's five are waited for instead, so that no task is finishing
	// (and no write of asynq's own in flight) when Redis dies.
	var turn time.Time
	for ran := 5; turn.IsZero(); ran += 5 {
		for log.Count() < ran {
			time.Sleep(5 * time.Millisecond)
		}
		r, err := limiter.Peek(ctx, "partner:sync")
		if err != nil {
			t.Fatal(err)
		}
		if r.RetryAfter > time.Second {
			turn = time.Now().Add(r.RetryAfter)
		} else if ran+5 >= tasks {
			t.Fatal("no window left its tasks a second to finish before the kill")
		}
	}
	time.Sleep(time.Until(turn.Add(-300 * time.Millisecond)))
	srv.Stop(t)
	stopped := time.Now()
	time.Sleep(time.Until(turn.Add(1500 * time.Millisecond)))
	srv.Start(t)
	outage := time.Since(stopped)

	info := f.WaitDone(t, &log, tasks, 60*time.Second)
	runs := log.Snapshot()
	asynqtest.CheckOnce(t, runs, ids)
	t.Logf("figures: %s: %d tasks (%d with MaxRetry(0)), Redis down %s across a window's turn; "+
		"%d runs, lost 0, duplicated 0, archived %d, failed %d; gate events %v",
		persisted(srv), tasks, (tasks+2)/3, outage.Round(100*time.Millisecond), len(runs), info.Archived, info.Failed, seen.ByKind())
	if info.Archived != 0 || info.Failed != 0 {
		t.Fatalf("%d archived, %d failed across the outage", info.Archived, info.Failed)
	}
	if seen.Count(worker.Failed) == 0 {
		t.Fatalf("no task asked the throttle while Redis was down: the test missed the outage (events %v)", seen.ByKind())
	}
}

// persisted names the server and how its data outlives a restart.
func persisted(srv *redistest.Server) string {
	if srv.Kind == "redis-server" {
		return "redis-server with AOF (appendfsync always), killed with SIGKILL"
	}
	return "miniredis, closed and restarted with its data in memory"
}

// enqueueSome enqueues n tasks of type partner:sync, every third one with
// no retries (MaxRetry(0)), and returns their IDs.
func enqueueSome(t *testing.T, f *asynqtest.Fleet, n int) []string {
	t.Helper()
	var ids []string
	for i := range n {
		var opts []asynq.Option
		if i%3 == 0 {
			opts = append(opts, asynq.MaxRetry(0))
		}
		ids = append(ids, f.Enqueue(t, "partner:sync", map[string]int{"n": i}, opts...))
	}
	return ids
}

// TestNothingIsLostInRoomsAndLines: 90 tasks of three tenants (a third with
// MaxRetry(0)) under 10/s per tenant, 15/s overall shared fairly by tenant,
// and a cap of 2 handlers at once, on two servers of 10 workers: tasks wait
// in the overall limit's room and in the cap's line, parked in asynq. After
// 30 have run the overall key is blocked for 3 s and Redis is killed and
// started again a second later, while the tasks wait. Every task then runs
// exactly once; none is archived or failed.
func TestNothingIsLostInRoomsAndLines(t *testing.T) {
	t.Parallel() // see the note above TestReliabilityFleetAcrossRedisRestart
	srv := redistest.StartServer(t, redistest.ServerOptions{AOF: true})
	tg := srv.Target(t)
	client := tg.NewClient(t)
	opts := []throttle.Option{throttle.WithPrefix(tg.Prefix), throttle.WithTimeout(time.Second), throttle.WithLogger(nil)}
	perTenant, err := throttle.New(client, "perTenant", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	overall, err := throttle.New(client, "overall", throttle.GCRA{Rate: throttle.PerSecond(15), Burst: 1}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	capped, err := throttle.NewConcurrencyLimiter(client, "capped", throttle.Concurrency{Limit: 2, Lease: 5 * time.Second}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	var seen asynqtest.Events
	tenant := worker.KeyBy(worker.ByPayloadField("tenant"))
	th := asynqtest.NewThrottler(t, tg, []worker.Rule{
		worker.Concurrency("cap", worker.Type("partner:sync"), capped, worker.KeyBy(worker.Constant("all"))),
		worker.Rate("tenant", worker.Type("partner:sync"), perTenant, tenant),
		worker.Rate("overall", worker.Type("partner:sync"), overall, worker.KeyBy(worker.Constant("all")), worker.FairBy(worker.ByPayloadField("tenant"))),
	}, worker.WithObserver(&seen), worker.WithLogger(nil))
	var log asynqtest.RunLog
	f := asynqtest.NewFleet(t, tg, 2, 10, th, log.Handler(20*time.Millisecond))
	const tasks = 90
	var ids []string
	for i := range tasks {
		var o []asynq.Option
		if i%3 == 0 {
			o = append(o, asynq.MaxRetry(0))
		}
		ids = append(ids, f.Enqueue(t, "partner:sync", map[string]any{"n": i, "tenant": []string{"a", "b", "c"}[i%3]}, o...))
	}
	for log.Count() < 30 {
		time.Sleep(10 * time.Millisecond)
	}
	if err := overall.BlockFor(context.Background(), "all", 3*time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the handlers running finish; the rest wait
	srv.Stop(t)
	stopped := time.Now()
	time.Sleep(time.Second)
	srv.Start(t)
	outage := time.Since(stopped)

	info := f.WaitDone(t, &log, tasks, 2*time.Minute)
	runs := log.Snapshot()
	asynqtest.CheckOnce(t, runs, ids)
	archived, err := f.Inspector.ListArchivedTasks(f.Queue)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("figures: %s: %d tasks (%d with MaxRetry(0)) in a room and a cap's line, outage %s; %d runs, lost 0, duplicated 0, archived %d, failed %d; gate events %v",
		persisted(srv), tasks, tasks/3, outage.Round(100*time.Millisecond), len(runs), len(archived), info.Failed, seen.ByKind())
	if info.Archived != 0 || len(archived) != 0 || info.Failed != 0 {
		t.Fatalf("%d archived, %d failed", len(archived), info.Failed)
	}
	if seen.Count(worker.Rescheduled) == 0 {
		t.Fatal("no task waited in asynq: the test missed the rooms and lines")
	}
}
