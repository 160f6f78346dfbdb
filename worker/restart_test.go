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

// TestReliabilityFleetAcrossRedisRestart: a fleet of two asynq servers
// works through 120 throttled tasks, a third of them with no retries left
// (MaxRetry(0): asynq archives such a task on any returned error). Redis,
// with its append-only file synced on every write, is killed in the middle
// of the run and started again two seconds later. Every task runs exactly
// once, none is lost or archived.
func TestReliabilityFleetAcrossRedisRestart(t *testing.T) {
	srv := redistest.StartServer(t, redistest.ServerOptions{AOF: true})
	tg := srv.Target(t)
	limiter, err := throttle.New(tg.NewClient(t), throttle.GCRA{Rate: throttle.PerSecond(20), Burst: 1},
		throttle.WithPrefix(tg.Prefix), throttle.WithTimeout(time.Second), throttle.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	var seen asynqtest.Events
	th := asynqtest.NewThrottler(t, tg, []worker.Rule{worker.Rate("sync", worker.Type("partner:sync"), limiter)},
		worker.WithObserver(&seen), worker.WithLogger(nil))
	var log asynqtest.RunLog
	f := asynqtest.NewFleet(t, tg, 2, 5, th, log.Handler(5*time.Millisecond))
	const tasks = 120
	var ids []string
	for i := range tasks {
		var opts []asynq.Option
		if i%3 == 0 {
			opts = append(opts, asynq.MaxRetry(0))
		}
		ids = append(ids, f.Enqueue(t, "partner:sync", map[string]int{"n": i}, opts...))
	}
	for log.Count() < 30 {
		time.Sleep(10 * time.Millisecond)
	}
	before := log.Count()
	srv.Stop(t)
	stopped := time.Now()
	time.Sleep(2 * time.Second)
	srv.Start(t)
	outage := time.Since(stopped)

	info := f.WaitDone(t, &log, tasks, 120*time.Second)
	runs := log.Snapshot()
	asynqtest.CheckOnce(t, runs, ids)
	archived, err := f.Inspector.ListArchivedTasks(f.Queue)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("figures: %s with AOF: %d tasks (%d with MaxRetry(0)), %d run before Redis was killed, outage %s; "+
		"%d runs, lost 0, duplicated 0, archived %d; gate events %v",
		srv.Kind, tasks, (tasks+2)/3, before, outage.Round(100*time.Millisecond), len(runs), len(archived), seen.ByKind())
	if info.Archived != 0 || len(archived) != 0 {
		t.Fatalf("%d tasks archived across the restart", len(archived))
	}
	if before >= tasks {
		t.Fatalf("all %d tasks ran before Redis was killed: the run did not cover the restart", before)
	}
	// The throttle still holds Redis's state for the key, as it was
	// persisted: decisions go on from it.
	if _, err := limiter.Peek(context.Background(), "partner:sync"); err != nil {
		t.Fatalf("after the restart: %v", err)
	}
}
