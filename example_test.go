package jobthrottle_test

import (
	"context"
	"log"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
	"github.com/redis/go-redis/v9"
)

// A first worker: partner calls held to 10 per second per tenant and at most
// 3 exports at once, across every asynq server that shares the Redis. The
// README shows the same code (TestREADMEShowsTheFirstWorker keeps the two
// identical). It needs a Redis at localhost:6379 and runs until SIGTERM, so
// it is compiled but not run; cmd/worker-demo runs a fleet on an embedded
// Redis.
func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})

	// 10 partner calls per second per tenant, counted across the fleet.
	perTenant, err := throttle.New(rdb, "partner-per-tenant", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1})
	if err != nil {
		log.Fatal(err) // an invalid name or policy
	}
	// At most 3 exports running at once, across the fleet.
	exports, err := throttle.NewConcurrencyLimiter(rdb, "exports", throttle.Concurrency{Limit: 3, Lease: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	th, err := worker.New(rdb, []worker.Rule{
		// The tenant is the "tenant_id" field of the task's JSON payload.
		worker.Rate("tenant", worker.Pattern("partner:*"), perTenant,
			worker.KeyBy(worker.ByPayloadField("tenant_id"))),
		worker.Concurrency("exports", worker.Type("export:run"), exports, worker.KeyBy(worker.Constant("exports"))),
	})
	if err != nil {
		log.Fatal(err) // a rule without a name, matcher, key or limiter
	}

	cfg := asynq.Config{Concurrency: 10}
	th.Configure(&cfg) // throttled tasks come back on time and use up no retry
	srv := asynq.NewServerFromRedisClient(rdb, cfg)
	mux := asynq.NewServeMux()
	mux.Use(th.Middleware) // every handler waits for its turn before it runs
	mux.HandleFunc("partner:sync", syncPartner)
	mux.HandleFunc("export:run", runExport)
	if err := srv.Run(mux); err != nil { // until SIGTERM or SIGINT
		log.Fatal(err)
	}

	// The server has stopped: stop the Throttler's background work too.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := th.Close(ctx); err != nil {
		log.Print(err)
	}
}

// syncPartner and runExport are the application's handlers. They hold no
// throttling code: the middleware decides before they run.
func syncPartner(ctx context.Context, t *asynq.Task) error { return nil }
func runExport(ctx context.Context, t *asynq.Task) error   { return nil }
