package throttle_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jobthrottle/jobthrottle/throttle"
)

// Two deploys of one limiter, the old policy and the new: the state is
// the limiter's name's, so what the old policy consumed counts for the new.
func ExampleNew_newPolicy() {
	client, m := exampleRedis()
	defer m.Close()
	ctx := context.Background()

	old, _ := throttle.New(client, "partner-api", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 10})
	next, _ := throttle.New(client, "partner-api", throttle.GCRA{Rate: throttle.PerSecond(5), Burst: 5})
	for range 3 {
		_, _ = old.Allow(ctx, "tenant-42")
	}
	r, _ := next.Peek(ctx, "tenant-42")
	fmt.Printf("after 3 units under the old policy, the new one has %d of %d left\n", r.Remaining, r.Limit)
	fmt.Println(old.Key("tenant-42"))
	// Output:
	// after 3 units under the old policy, the new one has 2 of 5 left
	// throttle:partner-api@gcra:{tenant-42}
}

// Tenants on two plans under one limiter.
func ExampleWithPlan() {
	client, m := exampleRedis()
	defer m.Close()
	ctx := context.Background()

	pro := map[string]bool{"acme": true}
	plans := throttle.WithPlan(func(_ context.Context, tenant string) throttle.Policy {
		if pro[tenant] {
			return throttle.GCRA{Rate: throttle.PerSecond(50), Burst: 50}
		}
		return nil // the limiter's own: the free plan
	})
	limiter, err := throttle.New(client, "api", throttle.GCRA{Rate: throttle.PerSecond(5), Burst: 5}, plans)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, tenant := range []string{"acme", "initech"} {
		r, _ := limiter.Allow(ctx, tenant)
		fmt.Printf("%s: %d of %d left\n", tenant, r.Remaining, r.Limit)
	}
	// Output:
	// acme: 49 of 50 left
	// initech: 4 of 5 left
}

// An operator raises a limit while the fleet runs, for every tenant and
// for one; every process applies it within a second.
func ExamplePolicyStore() {
	client, m := exampleRedis()
	defer m.Close()
	ctx := context.Background()

	limiter, _ := throttle.New(client, "partner-api", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 10},
		throttle.WithLivePolicies())
	store, err := throttle.NewPolicyStore(client, throttle.DefaultPrefix)
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = store.Set(ctx, "partner-api", throttle.GCRA{Rate: throttle.PerSecond(20), Burst: 20})
	_ = store.Set(ctx, "partner-api", throttle.GCRA{Rate: throttle.PerSecond(100), Burst: 100}, "acme")
	for _, tenant := range []string{"acme", "initech"} {
		p, _ := limiter.PolicyFor(ctx, tenant)
		fmt.Printf("%s: %s\n", tenant, p)
	}
	// Output:
	// acme: gcra:100/1s:100
	// initech: gcra:20/1s:20
}

// A partner's daily quota, which resets at midnight in its own zone.
func ExampleQuota() {
	client, m := exampleRedis() // Redis's clock: 2026-01-01 12:00 UTC
	defer m.Close()
	ctx := context.Background()

	tokyo, err := time.LoadLocation("Asia/Tokyo")
	if err != nil {
		fmt.Println(err)
		return
	}
	limiter, _ := throttle.New(client, "limiter", throttle.Quota{Limit: 2, Period: throttle.Day, Location: tokyo})
	for i := range 3 {
		r, _ := limiter.Allow(ctx, "partner")
		fmt.Printf("call %d: allowed %v, retry after %s\n", i+1, r.Allowed, r.RetryAfter)
	}
	// Output:
	// call 1: allowed true, retry after 0s
	// call 2: allowed true, retry after 0s
	// call 3: allowed false, retry after 3h0m0s
}
