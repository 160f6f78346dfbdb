package throttle_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// exampleRedis starts an embedded Redis with its clock stopped at a fixed
// instant, so the examples print the same every time. In your code, connect
// to your Redis instead: redis.NewClient(&redis.Options{Addr: "host:6379"}).
func exampleRedis() (*redis.Client, *miniredis.Miniredis) {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		panic(err)
	}
	m.SetTime(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	return redis.NewClient(&redis.Options{Addr: m.Addr()}), m
}

// A fleet-wide limit of 10 requests per second per tenant, with bursts of 2.
func Example() {
	client, m := exampleRedis()
	defer m.Close()
	ctx := context.Background()

	limiter, err := throttle.New(client, "partner-api", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 2})
	if err != nil {
		fmt.Println(err)
		return
	}
	for i := 0; i < 3; i++ {
		r, err := limiter.Allow(ctx, "tenant-42")
		if err != nil {
			fmt.Println(err) // Redis could not decide: fail closed
			return
		}
		if !r.Allowed {
			fmt.Printf("request %d: throttled, retry after %s\n", i+1, r.RetryAfter)
			continue
		}
		fmt.Printf("request %d: allowed, %d remaining\n", i+1, r.Remaining)
	}
	// Output:
	// request 1: allowed, 1 remaining
	// request 2: allowed, 0 remaining
	// request 3: throttled, retry after 100ms
}

func ExampleLimiter_AllowN() {
	client, m := exampleRedis()
	defer m.Close()
	ctx := context.Background()

	// An API that allows 100 units per minute; a batch call costs 30.
	limiter, _ := throttle.New(client, "api-requests", throttle.SlidingLog{Limit: 100, Window: time.Minute})
	for i := 0; i < 4; i++ {
		r, _ := limiter.AllowN(ctx, "partner-api", 30)
		fmt.Printf("batch %d: allowed=%v remaining=%d\n", i+1, r.Allowed, r.Remaining)
	}
	// More than the policy can ever admit is an error, not a long wait.
	_, err := limiter.AllowN(ctx, "partner-api", 101)
	fmt.Println(errors.Is(err, throttle.ErrExceedsLimit))
	// Output:
	// batch 1: allowed=true remaining=70
	// batch 2: allowed=true remaining=40
	// batch 3: allowed=true remaining=10
	// batch 4: allowed=false remaining=10
	// true
}

func ExampleLimiter_Peek() {
	client, m := exampleRedis()
	defer m.Close()
	ctx := context.Background()

	limiter, _ := throttle.New(client, "logins", throttle.FixedWindow{Limit: 5, Window: time.Minute})
	_, _ = limiter.AllowN(ctx, "nightly-export", 5)
	r, _ := limiter.Peek(ctx, "nightly-export")
	fmt.Printf("allowed=%v remaining=%d retry after %s\n", r.Allowed, r.Remaining, r.RetryAfter)
	// Output:
	// allowed=false remaining=0 retry after 1m0s
}

func ExampleWithFailurePolicy() {
	// Nothing listens on this port: Redis is down.
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialerRetries: 1})
	ctx := context.Background()
	policy := throttle.TokenBucket{Rate: throttle.PerSecond(50), Burst: 10}

	closed, _ := throttle.New(client, "fail-closed", policy) // the default
	_, err := closed.Allow(ctx, "k")
	fmt.Println("fail-closed:", errors.Is(err, throttle.ErrUnavailable))

	open, _ := throttle.New(client, "fail-open", policy, throttle.WithFailurePolicy(throttle.FailOpen))
	r, err := open.Allow(ctx, "k")
	fmt.Println("fail-open:", r.Allowed, r.Degraded, err)
	// Output:
	// fail-closed: true
	// fail-open: true true <nil>
}

// A limit that a failover must not reset: each admission is answered only
// once a replica has it. (Not run here: it needs a master with a replica.)
func ExampleWithReplicaAcks() {
	client := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:    "mymaster",
		SentinelAddrs: []string{"10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"},
	})
	payouts, err := throttle.New(client, "payouts", throttle.GCRA{Rate: throttle.PerMinute(10), Burst: 1},
		throttle.WithReplicaAcks(1, 100*time.Millisecond))
	if err != nil {
		fmt.Println(err)
		return
	}
	res, err := payouts.Allow(context.Background(), "account-7")
	switch {
	case errors.Is(err, throttle.ErrNotReplicated):
		fmt.Println("no replica has the decision: not admitted")
	case err != nil:
		fmt.Println(err)
	case res.Allowed:
		fmt.Println("admitted, and a replica has it")
	}
}

func ExampleLimiter_Wait() {
	client, m := exampleRedis()
	defer m.Close()

	// An outbound API allows 20 calls per second across all our processes.
	limiter, _ := throttle.New(client, "partner-api", throttle.GCRA{Rate: throttle.PerSecond(20), Burst: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for i := 0; i < 3; i++ {
		if err := limiter.Wait(ctx, "partner-api"); err != nil {
			fmt.Println(err) // the deadline is too near, or ctx was cancelled
			return
		}
		fmt.Println("call", i+1)
	}
	// Output:
	// call 1
	// call 2
	// call 3
}

func ExampleLimiter_Reserve() {
	client, m := exampleRedis()
	defer m.Close()
	ctx := context.Background()

	// Book slots for a batch at 50/s: each item gets its own start time.
	limiter, _ := throttle.New(client, "partner-api", throttle.GCRA{Rate: throttle.PerSecond(50), Burst: 1})
	for i := 0; i < 4; i++ {
		res, err := limiter.Reserve(ctx, "batch", 1, time.Minute)
		if err != nil || !res.OK {
			fmt.Println("not booked:", err)
			return
		}
		fmt.Printf("item %d starts in %s\n", i+1, res.Delay)
		// Hand res.StartAt to the scheduler, or block with res.Wait(ctx);
		// res.Cancel(ctx) gives the slot back if the item is dropped.
	}
	// Output:
	// item 1 starts in 0s
	// item 2 starts in 20ms
	// item 3 starts in 40ms
	// item 4 starts in 60ms
}

func ExampleConcurrencyLimiter_Acquire() {
	client, m := exampleRedis()
	defer m.Close()
	ctx := context.Background()

	// At most 2 exports per tenant at once, across the fleet.
	exports, _ := throttle.NewConcurrencyLimiter(client, "exports", throttle.Concurrency{Limit: 2, Lease: 30 * time.Second})
	var held []*throttle.Lease
	for i := 0; i < 3; i++ {
		lease, r, err := exports.Acquire(ctx, "tenant-42")
		if err != nil {
			fmt.Println(err)
			return
		}
		if lease == nil {
			fmt.Printf("export %d: busy, the oldest lease runs out in %s\n", i+1, r.RetryAfter)
			continue
		}
		fmt.Printf("export %d: running, %d slot(s) left\n", i+1, r.Remaining)
		held = append(held, lease)
	}
	for _, lease := range held {
		_ = lease.Release(ctx) // usually: defer lease.Release(ctx)
	}
	// Output:
	// export 1: running, 1 slot(s) left
	// export 2: running, 0 slot(s) left
	// export 3: busy, the oldest lease runs out in 30s
}

// A limiter that decides most requests in the process: each process that
// asks a key often is granted a share of its rate for a lease, renewed in
// the background, and decides within it without a Redis call. The fleet
// stays within the policy. (Not run: shares follow real time.)
func ExampleWithLeasedShares() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	ctx := context.Background()

	limiter, err := throttle.New(client, "search-api", throttle.GCRA{Rate: throttle.PerSecond(5000), Burst: 500},
		throttle.WithLeasedShares(0)) // leases of 1.5 s
	if err != nil {
		fmt.Println(err)
		return
	}
	defer limiter.Close(ctx) // gives this process's shares back

	r, err := limiter.Allow(ctx, "all")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(r.Allowed, r.Leased) // Leased: decided in memory, under this process's share
}
