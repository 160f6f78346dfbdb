package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
	"github.com/redis/go-redis/v9"
)

// Throttle an asynq handler to 10 tasks per second per tenant, across every
// server that shares the Redis.
func Example() {
	m := miniredis.NewMiniRedis() // an embedded Redis, for the example
	if err := m.Start(); err != nil {
		fmt.Println(err)
		return
	}
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	perTenant, err := throttle.New(rdb, "partner-per-tenant", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	th, err := worker.New(rdb, []worker.Rule{
		worker.Rate("tenant", worker.Pattern("partner:*"), perTenant, worker.KeyBy(worker.ByPayloadField("tenant"))),
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	var wg sync.WaitGroup
	wg.Add(3)
	mux := asynq.NewServeMux()
	mux.Use(th.Middleware)
	mux.HandleFunc("partner:sync", func(ctx context.Context, t *asynq.Task) error {
		defer wg.Done()
		fmt.Println("synced", string(t.Payload()))
		return nil
	})
	cfg := asynq.Config{Concurrency: 1, LogLevel: asynq.FatalLevel}
	th.Configure(&cfg) // RetryDelayFunc, IsFailure, DelayedTaskCheckInterval
	srv := asynq.NewServerFromRedisClient(rdb, cfg)
	if err := srv.Start(mux); err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Shutdown()

	client := asynq.NewClientFromRedisClient(rdb)
	for _, payload := range []string{`{"tenant":"acme","n":1}`, `{"tenant":"acme","n":2}`, `{"tenant":"acme","n":3}`} {
		if _, err := client.Enqueue(asynq.NewTask("partner:sync", []byte(payload))); err != nil {
			fmt.Println(err)
			return
		}
	}
	wg.Wait()
	// Output:
	// synced {"tenant":"acme","n":1}
	// synced {"tenant":"acme","n":2}
	// synced {"tenant":"acme","n":3}
}

// Rules by queue and by cost: the "bulk" queue shares 100 units a minute,
// and an export task costs as many units as the pages it asks for.
func ExampleCost() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	bulk, err := throttle.New(rdb, "bulk-email", throttle.GCRA{Rate: throttle.PerMinute(100), Burst: 20})
	if err != nil {
		fmt.Println(err)
		return
	}
	pages := func(ctx context.Context, t *asynq.Task) (int, error) {
		var p struct{ Pages int }
		if err := json.Unmarshal(t.Payload(), &p); err != nil {
			return 0, err
		}
		return max(1, p.Pages), nil
	}
	_, err = worker.New(rdb, []worker.Rule{
		worker.Rate("bulk", worker.Queue("bulk"), bulk, worker.KeyBy(worker.ByQueue()), worker.Cost(pages)),
	})
	if err != nil {
		fmt.Println(err)
	}
}
