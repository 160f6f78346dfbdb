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

// roundTrips counts the commands a client sends to Redis.
type roundTrips struct{ n atomic.Int64 }

func (c *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name != "hello" && name != "client" {
			c.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (c *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmds)
	}
}

// BenchmarkBacklog measures the worker the way FACTS.md measured naive
// retry-after rescheduling: two asynq servers of Concurrency 10 work off a
// backlog of 300 queued tasks under a 20/s policy. It reports the rate
// achieved, the most tasks started in any second, the throttle's Redis
// round trips per processed task (the limiter's client only; asynq's own
// traffic is not counted), and reschedules and inline waits per task.
// Each iteration takes about 15 s: run with -benchtime=1x. With -short
// (CI's smoke run) the backlog is 30 tasks.
//
//	REDIS_ADDR=127.0.0.1:6379 go test -run '^$' -bench Backlog -benchtime=1x ./worker/
func BenchmarkBacklog(b *testing.B) {
	for _, sc := range []struct {
		name      string
		policy    throttle.Policy
		rate      float64
		forwarder time.Duration
		servers   int
	}{
		// forwarder 0: what Configure sets (250 ms, and 100 ms polling);
		// 5 s: asynq's defaults, kept by Configure when set.
		{"gcra-burst1/configured", throttle.GCRA{Rate: throttle.PerSecond(20), Burst: 1}, 20, 0, 2},
		{"gcra-burst1/asynq-defaults", throttle.GCRA{Rate: throttle.PerSecond(20), Burst: 1}, 20, 5 * time.Second, 2},
		{"fixed-window-20-per-1s/configured", throttle.FixedWindow{Limit: 20, Window: time.Second}, 20, 0, 2},
		{"fixed-window-20-per-1s/asynq-defaults", throttle.FixedWindow{Limit: 20, Window: time.Second}, 20, 5 * time.Second, 2},
		{"gcra-5-per-s-over-provisioned/configured", throttle.GCRA{Rate: throttle.PerSecond(5), Burst: 1}, 5, 0, 2},
		{"gcra-5-per-s-over-provisioned/asynq-defaults", throttle.GCRA{Rate: throttle.PerSecond(5), Burst: 1}, 5, 5 * time.Second, 2},
	} {
		b.Run(sc.name, func(b *testing.B) {
			for range b.N {
				runBacklog(b, sc.policy, sc.rate, sc.forwarder, sc.servers)
			}
		})
	}
}

func runBacklog(b *testing.B, policy throttle.Policy, rate float64, forwarder time.Duration, servers int) {
	b.Helper()
	tg := redistest.New(b)
	counter := &roundTrips{}
	limiterClient := tg.NewClient(b)
	limiterClient.AddHook(counter)
	limiter, err := throttle.New(limiterClient, policy, throttle.WithPrefix(tg.Prefix))
	if err != nil {
		b.Fatal(err)
	}
	var seen asynqtest.Events
	th, err := worker.New(limiterClient, []worker.Rule{worker.Rate("backlog", worker.AnyTask(), limiter)},
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
	b.ReportMetric(100*achieved/rate, "%policy")
	b.ReportMetric(float64(asynqtest.MostInAnyWindow(runs, time.Second)), "max/1s")
	b.ReportMetric(float64(counter.n.Load())/float64(tasks), "rt/task")
	b.ReportMetric(float64(seen.Count(worker.Rescheduled))/float64(tasks), "resched/task")
	b.ReportMetric(float64(seen.Count(worker.WaitedInline))/float64(tasks), "inline/task")
}
