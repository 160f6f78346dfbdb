package dashboard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/dashboard"
	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
	"github.com/redis/go-redis/v9"
)

// liveFleet is a running fleet of asynq servers for the dashboard to show:
// each server with its own connection pool, limiters and Publisher, as
// separate machines would have, and a producer enqueuing tasks for several
// tenants for as long as the test runs.
type liveFleet struct {
	// rate is the first server's limiter of rateName: the tenants' rate,
	// for checking what the dashboard's actions did.
	rate *throttle.Limiter
	// capName is the concurrency cap's name.
	capName string
	log     asynqtest.RunLog
}

// Names and policies of the fleet's limiters.
const (
	rateName        = "partner-api"
	fleetServers    = 2
	fleetFlushEvery = 500 * time.Millisecond
)

var (
	ratePolicy = throttle.GCRA{Rate: throttle.PerSecond(5), Burst: 1}
	capPolicy  = throttle.Concurrency{Limit: 2, Lease: 10 * time.Second}
)

// startPublisher returns a Publisher on client under the target's prefix,
// flushing every fleetFlushEvery, closed when the test ends. Started
// before the fleet's servers, it is closed after their shutdown (cleanups
// run last first): their last decisions are flushed.
func startPublisher(t *testing.T, client redis.UniversalClient, tg *redistest.Target, opts ...dashboard.PublisherOption) *dashboard.Publisher {
	t.Helper()
	pub, err := dashboard.NewPublisher(client, append([]dashboard.PublisherOption{dashboard.WithPublishPrefix(tg.Prefix),
		dashboard.WithFlushInterval(fleetFlushEvery)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := pub.Close(ctx); err != nil {
			t.Errorf("closing a Publisher: %v", err)
		}
	})
	return pub
}

// startLiveFleet starts the fleet on tg: two servers, each with a named
// GCRA limiter of 5/s per tenant (a worker.Rate rule keyed by the payload's
// "tenant") and a cap of 2 tasks at once per tenant, sending
// every task that must wait back to asynq (no inline waits: a fast Redis
// would otherwise absorb the excess in the handlers' waits, and nothing
// would be throttled or rescheduled); and a
// producer that enqueues, every 150 ms, one task for each steady tenant
// (6.7/s each, more than their limit admits, so they are throttled and
// rescheduled all along) and, every 3 s, a burst of 8 for the bursty
// tenant (under its limit on average, so the fleet's admissions per
// second rise and fall). Everything stops when the test ends.
func startLiveFleet(t *testing.T, tg *redistest.Target, steady []string, bursty string) *liveFleet {
	t.Helper()
	lf := &liveFleet{}
	f := asynqtest.NewFleet(t, tg, 0, 0, nil, nil)
	for i := range fleetServers {
		client := tg.NewClient(t)
		pub := startPublisher(t, client, tg, dashboard.WithProcessName(fmt.Sprintf("server-%d", i+1)))
		rate, err := throttle.New(client, rateName, ratePolicy, throttle.WithPrefix(tg.Prefix), throttle.WithObserver(pub))
		if err != nil {
			t.Fatal(err)
		}
		perTenantCap, err := throttle.NewConcurrencyLimiter(client, "per-tenant-cap", capPolicy, throttle.WithPrefix(tg.Prefix), throttle.WithObserver(pub))
		if err != nil {
			t.Fatal(err)
		}
		if lf.rate == nil {
			lf.rate, lf.capName = rate, perTenantCap.Name()
		}
		byTenant := worker.KeyBy(worker.ByPayloadField("tenant"))
		th, err := worker.New(client, []worker.Rule{
			worker.Rate("tenant-rate", worker.Pattern("partner:*"), rate, byTenant),
			worker.Concurrency("tenant-cap", worker.Pattern("partner:*"), perTenantCap, byTenant),
		}, worker.WithPrefix(tg.Prefix), worker.WithObserver(pub), worker.WithInlineWait(0))
		if err != nil {
			t.Fatal(err)
		}
		f.AddServer(t, 5, th, lf.log.Handler(20*time.Millisecond))
	}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	// Registered after the servers, so it runs before their shutdown.
	t.Cleanup(func() { cancel(); wg.Wait() })
	go func() {
		defer wg.Done()
		enqueue := func(tenant string) {
			body, _ := json.Marshal(map[string]string{"tenant": tenant})
			// Errors are for the test's checks to find: a fleet with no
			// tasks shows nothing.
			_, _ = f.Client.EnqueueContext(ctx, asynq.NewTask("partner:sync", body), asynq.Queue(f.Queue))
		}
		tick := time.NewTicker(150 * time.Millisecond)
		defer tick.Stop()
		for n := 0; ; n++ {
			for _, tenant := range steady {
				enqueue(tenant)
			}
			if n%20 == 0 {
				for range 8 {
					enqueue(bursty)
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return lf
}
