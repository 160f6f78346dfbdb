package main

import (
	"time"

	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
	"github.com/redis/go-redis/v9"
)

// scenario is one workload of the fleet benchmark: tasks spread evenly over
// tenants, each taking work in its handler, under rules.
type scenario struct {
	name    string
	about   string
	tasks   int
	tenants int
	work    time.Duration
	// perKey and overall are the policy's allowance in any 1 s (rate plus
	// burst), per tenant and for the whole fleet; 0: none.
	perKey, overall int
	// ideal is the rate the limits allow for the whole fleet, tasks/s; 0:
	// not rate-bound.
	ideal float64
	rules func(redis.UniversalClient) ([]worker.Rule, error)
}

// byTenant keys a rule by the task's tenant.
var byTenant = worker.KeyBy(worker.ByPayloadField("tenant"))

// fleetTask matches the fleet's tasks.
var fleetTask = worker.Type("fleet:task")

var scenarios = []scenario{
	{
		name: "never-binds", about: "GCRA far above the load (100,000/s per tenant)",
		tasks: 400, tenants: 4, work: 5 * time.Millisecond,
		rules: func(rdb redis.UniversalClient) ([]worker.Rule, error) {
			l, err := throttle.New(rdb, "far-above", throttle.GCRA{Rate: throttle.PerSecond(100_000), Burst: 100})
			return []worker.Rule{worker.Rate("tenant", fleetTask, l, byTenant)}, err
		},
	},
	{
		name: "noop-never-binds", about: "GCRA far above the load (100,000/s per tenant), handlers that return at once",
		tasks: 20_000, tenants: 4,
		rules: func(rdb redis.UniversalClient) ([]worker.Rule, error) {
			l, err := throttle.New(rdb, "far-above", throttle.GCRA{Rate: throttle.PerSecond(100_000), Burst: 100})
			return []worker.Rule{worker.Rate("tenant", fleetTask, l, byTenant)}, err
		},
	},
	{
		name: "noop-never-binds-leased", about: "the same with leased shares (throttle.WithLeasedShares)",
		tasks: 20_000, tenants: 4,
		rules: func(rdb redis.UniversalClient) ([]worker.Rule, error) {
			l, err := throttle.New(rdb, "far-above-leased", throttle.GCRA{Rate: throttle.PerSecond(100_000), Burst: 100}, throttle.WithLeasedShares(0))
			return []worker.Rule{worker.Rate("tenant", fleetTask, l, byTenant)}, err
		},
	},
	{
		name: "mixed-never-binds", about: "a cap, a window and a GCRA per tenant, all far above the load",
		tasks: 400, tenants: 4, work: 5 * time.Millisecond,
		rules: func(rdb redis.UniversalClient) ([]worker.Rule, error) {
			capLimiter, err := throttle.NewConcurrencyLimiter(rdb, "far-above-cap", throttle.Concurrency{Limit: 10_000, Lease: 30 * time.Second})
			if err != nil {
				return nil, err
			}
			window, err := throttle.New(rdb, "far-above-window", throttle.FixedWindow{Limit: 1_000_000, Window: time.Minute})
			if err != nil {
				return nil, err
			}
			rate, err := throttle.New(rdb, "far-above", throttle.GCRA{Rate: throttle.PerSecond(100_000), Burst: 100})
			return []worker.Rule{
				worker.Concurrency("cap", fleetTask, capLimiter, byTenant),
				worker.Rate("window", fleetTask, window, byTenant),
				worker.Rate("tenant", fleetTask, rate, byTenant),
			}, err
		},
	},
	{
		name: "one-rule", about: "GCRA 20/s per tenant, 4 tenants, all enqueued at once",
		tasks: 400, tenants: 4, work: 5 * time.Millisecond, perKey: 21, ideal: 80,
		rules: func(rdb redis.UniversalClient) ([]worker.Rule, error) {
			l, err := throttle.New(rdb, "per-tenant", throttle.GCRA{Rate: throttle.PerSecond(20), Burst: 1})
			return []worker.Rule{worker.Rate("tenant", fleetTask, l, byTenant)}, err
		},
	},
	{
		name: "two-rules", about: "10/s per tenant and 20/s overall shared fairly by tenant",
		tasks: 200, tenants: 4, work: 5 * time.Millisecond, perKey: 11, overall: 21, ideal: 20,
		rules: func(rdb redis.UniversalClient) ([]worker.Rule, error) {
			tenant, err := throttle.New(rdb, "per-tenant", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1})
			if err != nil {
				return nil, err
			}
			overall, err := throttle.New(rdb, "overall", throttle.GCRA{Rate: throttle.PerSecond(20), Burst: 1})
			return []worker.Rule{
				worker.Rate("tenant", fleetTask, tenant, byTenant),
				worker.Rate("overall", fleetTask, overall, worker.KeyBy(worker.Constant("all")), worker.FairBy(worker.ByPayloadField("tenant"))),
			}, err
		},
	},
	{
		name: "cap", about: "at most 3 at once, tasks of 100 ms",
		tasks: 60, tenants: 1, work: 100 * time.Millisecond, ideal: 30,
		rules: func(rdb redis.UniversalClient) ([]worker.Rule, error) {
			l, err := throttle.NewConcurrencyLimiter(rdb, "exports", throttle.Concurrency{Limit: 3, Lease: 30 * time.Second})
			return []worker.Rule{worker.Concurrency("cap", fleetTask, l, worker.KeyBy(worker.Constant("all")))}, err
		},
	},
}

func scenarioNamed(name string) (scenario, bool) {
	for _, sc := range scenarios {
		if sc.name == name {
			return sc, true
		}
	}
	return scenario{}, false
}
