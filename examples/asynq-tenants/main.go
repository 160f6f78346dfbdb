// Command asynq-tenants throttles an asynq handler per tenant: each tenant's
// partner-API calls are held to 5 per second across every server sharing
// the Redis, and one tenant's backlog does not hold back the others.
//
//	go run ./examples/asynq-tenants
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/examples/internal/embedded"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
)

func main() {
	rdb, stop := embedded.Redis() // in production: redis.NewClient(&redis.Options{Addr: "redis:6379"})
	defer stop()

	// One limit per tenant, shared by the whole fleet: 5 calls a second.
	perTenant, err := throttle.New(rdb, "partner-per-tenant", throttle.GCRA{Rate: throttle.PerSecond(5), Burst: 1})
	if err != nil {
		log.Fatal(err)
	}
	th, err := worker.New(rdb, []worker.Rule{
		worker.Rate("tenant", worker.Type("partner:sync"), perTenant,
			worker.KeyBy(worker.ByPayloadField("tenant"))),
	})
	if err != nil {
		log.Fatal(err)
	}

	// The handler: record when each tenant's call ran.
	start := time.Now()
	var mu sync.Mutex
	var wg sync.WaitGroup
	finished := map[string]time.Duration{}
	mux := asynq.NewServeMux()
	mux.Use(th.Middleware) // the throttle runs before every handler
	mux.HandleFunc("partner:sync", func(ctx context.Context, t *asynq.Task) error {
		defer wg.Done()
		var p struct{ Tenant string }
		if err := json.Unmarshal(t.Payload(), &p); err != nil {
			return err
		}
		mu.Lock()
		finished[p.Tenant] = time.Since(start)
		mu.Unlock()
		return nil
	})

	// Configure wires asynq so throttled tasks come back on time and are
	// not counted as failures.
	cfg := asynq.Config{Concurrency: 10, LogLevel: asynq.FatalLevel}
	th.Configure(&cfg)
	srv := asynq.NewServerFromRedisClient(rdb, cfg)
	if err := srv.Start(mux); err != nil {
		log.Fatal(err)
	}
	defer func() { _ = th.Close(context.Background()) }() // after the server: stops the dispatcher that brings tasks back
	defer srv.Shutdown()

	// A big tenant with 20 calls and two small ones with 5 each.
	client := asynq.NewClientFromRedisClient(rdb)
	for tenant, n := range map[string]int{"big": 20, "small-1": 5, "small-2": 5} {
		for range n {
			body, _ := json.Marshal(map[string]string{"tenant": tenant})
			if _, err := client.Enqueue(asynq.NewTask("partner:sync", body)); err != nil {
				log.Fatal(err)
			}
			wg.Add(1)
		}
	}
	wg.Wait()
	for _, tenant := range []string{"small-1", "small-2", "big"} {
		fmt.Printf("tenant %-8s done after %.1fs\n", tenant, finished[tenant].Seconds())
	}
	// The small tenants finish in about a second (5 at 5/s), the big one in
	// about four (20 at 5/s): each held to its own limit.
}
