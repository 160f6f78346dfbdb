package scheduler_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/scheduler"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
	"github.com/redis/go-redis/v9"
)

// Pace a batch of partner calls at the workers' limit of 50 per second:
// each task is enqueued to start at a slot of its own, 20 ms after the one
// before, instead of all at once to be throttled task by task.
func ExamplePace() {
	m := miniredis.NewMiniRedis() // an embedded Redis, for the example
	if err := m.Start(); err != nil {
		fmt.Println(err)
		return
	}
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	// The workers' Throttler: the same rules as the servers run.
	limiter, err := throttle.New(rdb, "partner-api", throttle.GCRA{Rate: throttle.PerSecond(50), Burst: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	th, err := worker.New(rdb, []worker.Rule{
		worker.Rate("partner", worker.Type("partner:sync"), limiter, worker.KeyBy(worker.Constant("partner"))),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	var cfg asynq.Config
	th.Configure(&cfg) // the workers' asynq settings, which the plan allows for

	var tasks []*asynq.Task
	for _, customer := range []string{"c1", "c2", "c3", "c4"} {
		tasks = append(tasks, asynq.NewTask("partner:sync", []byte(`{"customer":"`+customer+`"}`)))
	}
	client := asynq.NewClientFromRedisClient(rdb)
	planned, err := scheduler.Pace(ctx, client, th, "resync-2026-01-01", tasks)
	if err != nil {
		fmt.Println(err) // Redis or asynq failed: run Pace again, it enqueues nothing twice
		return
	}
	for _, p := range planned {
		fmt.Printf("%s starts %s after the first\n", p.ID, p.StartAt.Sub(planned[0].StartAt))
	}
	// Output:
	// resync-2026-01-01:000000000 starts 0s after the first
	// resync-2026-01-01:000000001 starts 20ms after the first
	// resync-2026-01-01:000000002 starts 40ms after the first
	// resync-2026-01-01:000000003 starts 60ms after the first
}

// A nightly re-sync of every customer at 02:00 Berlin time, produced by one
// replica however many run it, and paced on the workers' limit. It needs a
// Redis at localhost:6379 and runs until SIGTERM, so it is compiled but not
// run.
func ExampleScheduler_Add() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	perTenant, err := throttle.New(rdb, "partner-per-tenant", throttle.GCRA{Rate: throttle.PerSecond(50), Burst: 1})
	if err != nil {
		log.Fatal(err)
	}
	th, err := worker.New(rdb, []worker.Rule{
		worker.Rate("partner", worker.Type("partner:sync"), perTenant, worker.KeyBy(worker.Constant("partner"))),
	})
	if err != nil {
		log.Fatal(err)
	}
	cfg := asynq.Config{Concurrency: 10} // the workers' settings
	th.Configure(&cfg)

	s, err := scheduler.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	err = s.Add("nightly-resync", "CRON_TZ=Europe/Berlin 30 3 * * *",
		scheduler.Stream(func(ctx context.Context, emit func(*asynq.Task) error) error {
			// Build the batch from the scheduled time, not the clock: a batch
			// cut short is produced again, and must emit the same tasks.
			night, _ := scheduler.TickTime(ctx)
			for _, id := range customerIDs(night) {
				if err := emit(asynq.NewTask("partner:sync", []byte(id))); err != nil {
					return err
				}
			}
			return nil
		}),
		scheduler.PacedBy(th),
	)
	if err != nil {
		log.Fatal(err) // a bad cron spec
	}
	if err := s.Start(); err != nil {
		log.Fatal(err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Stop(shutdown); err != nil {
		log.Print(err) // a producer did not return in time; another replica finishes its batch
	}
}

// customerIDs stands for the application's query of the customers to sync
// as of a night.
func customerIDs(night time.Time) []string { return []string{"c1", "c2", "c3"} }
