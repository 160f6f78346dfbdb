// Command nightly-batch runs a batch job on a cron schedule with the
// scheduler, paced on the workers' throttle: its tasks are booked one slot
// each and enqueued to arrive at their slots, so they flow to the partner at
// the policy's rate and are admitted on arrival instead of being throttled
// again and again. Run the scheduler on every replica: each tick fires once.
//
//	go run ./examples/nightly-batch
package main

import (
	"context"
	"fmt"
	"log"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/examples/internal/embedded"
	"github.com/jobthrottle/jobthrottle/scheduler"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
)

func main() {
	rdb, stop := embedded.Redis() // in production: redis.NewClient(&redis.Options{Addr: "redis:6379"})
	defer stop()

	// The workers' rule: 20 partner syncs a second.
	limiter, err := throttle.New(rdb, "partner-api", throttle.GCRA{Rate: throttle.PerSecond(20), Burst: 1})
	if err != nil {
		log.Fatal(err)
	}
	var throttled atomic.Int32
	th, err := worker.New(rdb, []worker.Rule{worker.Rate("partner", worker.Type("customer:sync"), limiter, worker.KeyBy(worker.Constant("partner")))},
		worker.WithObserver(worker.ObserverFunc(func(_ context.Context, e worker.Event) {
			if e.Kind == worker.Rescheduled {
				throttled.Add(1)
			}
		})))
	if err != nil {
		log.Fatal(err)
	}

	// The workers.
	const customers = 60
	var wg sync.WaitGroup
	wg.Add(customers)
	start := time.Now()
	var first, last atomic.Int64
	cfg := asynq.Config{Concurrency: 20, LogLevel: asynq.FatalLevel}
	th.Configure(&cfg) // in the scheduler's process too: it plans around these settings
	srv := asynq.NewServerFromRedisClient(rdb, cfg)
	if err := srv.Start(th.Middleware(asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		at := time.Since(start).Milliseconds()
		first.CompareAndSwap(0, at)
		last.Store(at)
		wg.Done()
		return nil
	}))); err != nil {
		log.Fatal(err)
	}
	defer func() { _ = th.Close(context.Background()) }() // after the server: stops the dispatcher that brings tasks back
	defer srv.Shutdown()

	// The nightly job; here every 2 seconds, once. In production:
	// "CRON_TZ=Europe/Berlin 30 3 * * *".
	sched, err := scheduler.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	var once atomic.Bool
	err = sched.Add("resync", "@every 2s", scheduler.Batch(func(ctx context.Context) ([]*asynq.Task, error) {
		if once.Swap(true) {
			return nil, nil
		}
		batch := make([]*asynq.Task, customers)
		for i := range batch {
			batch[i] = asynq.NewTask("customer:sync", []byte(fmt.Sprintf(`{"customer":%d}`, i)))
		}
		fmt.Printf("%5.2fs  the scheduler paces %d syncs at 20/s\n", time.Since(start).Seconds(), customers)
		return batch, nil
	}), scheduler.PacedBy(th))
	if err != nil {
		log.Fatal(err)
	}
	if err := sched.Start(); err != nil {
		log.Fatal(err)
	}
	wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := sched.Stop(ctx); err != nil {
		log.Fatal(err)
	}
	span := time.Duration(last.Load()-first.Load()) * time.Millisecond
	fmt.Printf("%d syncs ran over %.2fs (60 at 20/s: 2.95s), %d throttled on arrival\n", customers, span.Seconds(), throttled.Load())
}
