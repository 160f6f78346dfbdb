package worker_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
	"github.com/redis/go-redis/v9"
)

// roundTrips counts the round trips a client makes to Redis: each command
// but a connection's set-up (HELLO, CLIENT), and each pipeline; with
// scripts, only those that run scripts (EVALSHA, EVAL); with only, only
// the commands of that name (as go-redis names them: "ping").
type roundTrips struct {
	n       atomic.Int64
	scripts bool
	only    string
}

// counts reports whether a round trip that starts with cmd is counted.
func (c *roundTrips) counts(cmd redis.Cmder) bool {
	name := cmd.Name()
	switch {
	case c.only != "":
		return name == c.only
	case c.scripts:
		return name == "evalsha" || name == "eval"
	}
	return name != "hello" && name != "client"
}

func (c *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if c.counts(cmd) {
			c.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (c *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !c.scripts && c.only == "" || (len(cmds) > 0 && c.counts(cmds[0])) {
			c.n.Add(1)
		}
		return next(ctx, cmds)
	}
}

// BenchmarkBacklog measures the worker on the scenarios issue 15 set it:
// each runs real asynq servers (two of Concurrency 10) on the Redis of the
// test (REDIS_ADDR for a real one) and reports, per tenant, the rate it
// achieved on the Redis clock (<tenant>-tasks/s) and the most admissions in
// any 1 s (<tenant>-max/1s), then trips through asynq per task (a task sent
// back because of throttling) and the library's Redis round trips per task
// (the Throttler's client; asynq's own traffic is not counted).
//
//   - idle-one-rule: one tenant's 60 tasks under 10/s, nothing else to do;
//   - busy-one-rule: the same while other tasks of 100 ms keep every worker
//     busy, with 2 s of the fleet's work queued ahead of any task sent back;
//   - busy-per-key-and-overall: two tenants' 50 tasks each under 10/s per
//     tenant and 20/s overall, on the busy fleet;
//   - skewed-fairness: 30/s overall shared fairly by tenant (FairBy), each
//     tenant held to 20/s; one enqueues 300 tasks, two others 30 each a
//     second later: the rates reported are those while all three had a
//     backlog, and overall-tasks/s their sum;
//   - concurrency-cap: 30 tasks of 200 ms under a cap of 3: the time from
//     the first lease to the last release (the cap allows 2.0 s), the part
//     of it the cap was held, and the longest a freed slot waited for a
//     waiting task (on the wall clock);
//   - paced-backlog: 300 queued tasks under 20/s, burst 1, with as many
//     workers as the rate can keep busy within the inline wait (the setup
//     of FACTS.md's measure of naive rescheduling).
//
// Each takes 3 to 15 s: run with -benchtime=1x. With -short (CI's smoke
// run) the backlogs are a fifth as long.
//
//	REDIS_ADDR=127.0.0.1:6379 go test -run '^$' -bench Backlog -benchtime=1x ./worker/
func BenchmarkBacklog(b *testing.B) {
	size := func(n int) int {
		if testing.Short() {
			return max(5, n/5)
		}
		return n
	}
	busy := func(sc scenario) scenario {
		sc.filler, sc.busyAhead = 100*time.Millisecond, 2*time.Second
		return sc
	}
	for _, sc := range []struct {
		name string
		sc   scenario
		// shared: report the tenants' rates while all of them had a
		// backlog, not over their whole run.
		shared bool
	}{
		{"idle-one-rule", scenario{servers: 2, concurrency: 10, rules: perTenant(10), work: 5 * time.Millisecond,
			tenants: []backlog{{tenant: "t1", tasks: size(60)}}}, false},
		{"busy-one-rule", busy(scenario{servers: 2, concurrency: 10, rules: perTenant(10), work: 5 * time.Millisecond,
			tenants: []backlog{{tenant: "t1", tasks: size(60)}}}), false},
		{"busy-per-key-and-overall", busy(scenario{servers: 2, concurrency: 10, rules: perTenantAndOverall(10, 20, false), work: 5 * time.Millisecond,
			tenants: []backlog{{tenant: "t1", tasks: size(50)}, {tenant: "t2", tasks: size(50)}}}), false},
		{"skewed-fairness", scenario{servers: 2, concurrency: 10, rules: perTenantAndOverall(20, 30, true), work: 5 * time.Millisecond,
			tenants: []backlog{{tenant: "big", tasks: size(300)}, {tenant: "small-1", tasks: size(30), after: time.Second}, {tenant: "small-2", tasks: size(30), after: time.Second}}}, true},
	} {
		b.Run(sc.name, func(b *testing.B) {
			for range b.N {
				out := runScenario(b, redistest.New(b), sc.sc)
				var from, to time.Time
				if sc.shared {
					var names []string
					for _, t := range sc.sc.tenants {
						names = append(names, t.tenant)
					}
					if from, to = out.shared(names...); !to.After(from) {
						from, to = time.Time{}, time.Time{} // too short to share (-short)
					}
				}
				total := 0.0
				for tenant, runs := range out.byTenant() {
					rate := out.rate(runs, from, to)
					total += rate
					b.ReportMetric(rate, tenant+"-tasks/s")
					b.ReportMetric(float64(out.mostInASecond(runs)), tenant+"-max/1s")
				}
				if sc.shared {
					b.ReportMetric(total, "overall-tasks/s")
				}
				b.ReportMetric(out.trips(), "trips/task")
				b.ReportMetric(out.roundTrips, "rt/task")
			}
		})
	}
	b.Run("concurrency-cap", func(b *testing.B) {
		for range b.N {
			out := runCapped(b, redistest.New(b), size(30), 3, 2, 200*time.Millisecond)
			b.ReportMetric(out.span.Seconds(), "s-to-finish")
			b.ReportMetric(100*out.heldShare, "%held")
			b.ReportMetric(float64(out.worstWake.Microseconds())/1000, "ms-slowest-wake")
			b.ReportMetric(float64(out.mostHeld), "max-held")
			b.ReportMetric(float64(out.trips)/float64(size(30)), "trips/task")
			b.ReportMetric(out.roundTrips, "rt/task")
		}
	})
	b.Run("paced-backlog", func(b *testing.B) {
		for range b.N {
			runBacklog(b, throttle.GCRA{Rate: throttle.PerSecond(20), Burst: 1}, 20, 0, 2)
		}
	})
}

func runBacklog(b *testing.B, policy throttle.Policy, rate float64, forwarder time.Duration, servers int) {
	b.Helper()
	tg := redistest.New(b)
	counter := &roundTrips{}
	limiterClient := tg.NewClient(b)
	limiterClient.AddHook(counter)
	limiter, err := throttle.New(limiterClient, "limiter", policy, throttle.WithPrefix(tg.Prefix))
	if err != nil {
		b.Fatal(err)
	}
	var seen asynqtest.Events
	th, err := worker.New(limiterClient, []worker.Rule{worker.Rate("backlog", worker.AnyTask(), limiter, worker.KeyBy(worker.ByType()))},
		worker.WithPrefix(tg.Prefix), worker.WithObserver(&seen))
	if err != nil {
		b.Fatal(err)
	}
	var log asynqtest.RunLog
	queue := "bench-" + tg.Prefix[len(tg.Prefix)-9:len(tg.Prefix)-1]
	client := asynq.NewClientFromRedisClient(tg.NewClient(b))
	inspector := asynq.NewInspectorFromRedisClient(tg.NewClient(b))
	b.Cleanup(func() { _ = inspector.DeleteQueue(queue, true) })
	tasks := 300
	if testing.Short() {
		tasks = 30
	}
	for i := range tasks {
		if _, err := client.Enqueue(asynq.NewTask("backlog", []byte(fmt.Sprint(i))), asynq.Queue(queue)); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for range servers {
		cfg := asynq.Config{Concurrency: 10, Queues: map[string]int{queue: 1}, LogLevel: asynq.FatalLevel,
			DelayedTaskCheckInterval: forwarder, ShutdownTimeout: 3 * time.Second}
		if forwarder > 0 {
			cfg.TaskCheckInterval = time.Second // asynq's default
		}
		th.Configure(&cfg)
		srv := asynq.NewServerFromRedisClient(tg.NewClient(b), cfg)
		b.Cleanup(srv.Shutdown)
		if err := srv.Start(th.Middleware(log.Handler(0))); err != nil {
			b.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Minute)
	for log.Count() < tasks {
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d tasks after 5 minutes", log.Count(), tasks)
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.StopTimer()
	runs := log.Snapshot()
	took := runs[len(runs)-1].At.Sub(runs[0].At)
	achieved := float64(tasks-1) / took.Seconds()
	b.ReportMetric(achieved, "tasks/s")
	b.ReportMetric(float64(asynqtest.MostInAnyWindow(runs, time.Second)), "max/1s")
	b.ReportMetric(float64(seen.Count(worker.Rescheduled))/float64(tasks), "trips/task")
	b.ReportMetric(float64(counter.n.Load())/float64(tasks), "rt/task")
}
