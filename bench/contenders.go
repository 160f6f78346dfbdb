package main

import (
	"context"
	"fmt"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// contender is one limiter under test: a decision for a key.
type contender struct {
	name   string
	ours   bool
	decide func(ctx context.Context, key string) (bool, error)
	// limiter is ours, for the sections that need more than decide.
	limiter *throttle.Limiter
}

// Policies that always admit and always write, so every call does the full
// work: a million a second with a million of burst. (redis_rate skips the
// write for limits so large that float rounding leaves the state unchanged;
// a million a second is below that.)
const huge = 1_000_000

func theirs(rdb redis.UniversalClient) contender {
	l := redis_rate.NewLimiter(rdb)
	limit := redis_rate.Limit{Rate: huge, Burst: huge, Period: time.Second}
	return contender{name: "redis_rate GCRA", decide: func(ctx context.Context, key string) (bool, error) {
		res, err := l.Allow(ctx, key, limit)
		if err != nil {
			return false, err
		}
		return res.Allowed > 0, nil
	}}
}

func ours(rdb redis.UniversalClient, prefix string, p throttle.Policy, name string, opts ...throttle.Option) (contender, error) {
	l, err := throttle.New(rdb, fmt.Sprint(p), p, append([]throttle.Option{throttle.WithPrefix(prefix)}, opts...)...)
	if err != nil {
		return contender{}, err
	}
	return contender{name: name, ours: true, limiter: l, decide: func(ctx context.Context, key string) (bool, error) {
		r, err := l.Allow(ctx, key)
		return r.Allowed, err
	}}, nil
}

// contenders returns redis_rate, every algorithm of ours as New makes it
// (coalescing up to 64 decisions a round trip), then GCRA and TokenBucket
// again with coalescing off, each decision its own round trip as
// redis_rate's are, at policies that admit everything.
func contenders(rdb redis.UniversalClient, prefix string) ([]contender, error) {
	out := []contender{theirs(rdb)}
	alone := throttle.WithCoalescing(0)
	for _, c := range []struct {
		name string
		p    throttle.Policy
		opts []throttle.Option
	}{
		{"GCRA", throttle.GCRA{Rate: throttle.PerSecond(huge), Burst: huge}, nil},
		{"TokenBucket", throttle.TokenBucket{Rate: throttle.PerSecond(huge), Burst: huge}, nil},
		{"LeakyBucket", throttle.LeakyBucket{Rate: throttle.PerSecond(huge), Capacity: huge}, nil},
		{"FixedWindow", throttle.FixedWindow{Limit: huge * 1000, Window: time.Second}, nil},
		{"SlidingWindow", throttle.SlidingWindow{Limit: huge * 1000, Window: time.Second}, nil},
		{"SlidingLog", throttle.SlidingLog{Limit: 10_000, Window: 10 * time.Millisecond}, nil}, // the largest log a key may hold
		{"GCRA, no coalescing", throttle.GCRA{Rate: throttle.PerSecond(huge), Burst: huge}, []throttle.Option{alone}},
		{"TokenBucket, no coalescing", throttle.TokenBucket{Rate: throttle.PerSecond(huge), Burst: huge}, []throttle.Option{alone}},
	} {
		o, err := ours(rdb, prefix, c.p, c.name, c.opts...)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.name, err)
		}
		out = append(out, o)
	}
	return out, nil
}

// memoryContender is a contender at a realistic policy, with the Redis key
// it keeps a caller key's state in.
type memoryContender struct {
	decide func(ctx context.Context, key string) (bool, error)
	keyOf  func(callerKey string) string
}

// memoryContenders returns, in the order of contenders, the same limiters at
// the policies of a real deployment (10 a minute, a burst of 5), whose keys
// are as long as a user's would be, and whose state outlives the
// measurement.
func memoryContenders(rdb redis.UniversalClient, prefix string) ([]memoryContender, error) {
	rl := redis_rate.NewLimiter(rdb)
	out := []memoryContender{{
		decide: func(ctx context.Context, key string) (bool, error) {
			res, err := rl.Allow(ctx, key, redis_rate.Limit{Rate: 10, Burst: 5, Period: time.Minute})
			return err == nil && res.Allowed > 0, err
		},
		keyOf: func(k string) string { return "rate:" + k },
	}}
	for _, p := range []throttle.Policy{
		throttle.GCRA{Rate: throttle.PerMinute(10), Burst: 5},
		throttle.TokenBucket{Rate: throttle.PerMinute(10), Burst: 5},
		throttle.LeakyBucket{Rate: throttle.PerMinute(10), Capacity: 5},
		throttle.FixedWindow{Limit: 10, Window: time.Minute},
		throttle.SlidingWindow{Limit: 10, Window: time.Minute},
		throttle.SlidingLog{Limit: 10, Window: time.Minute},
	} {
		l, err := throttle.New(rdb, fmt.Sprint(p), p) // the default prefix, as users have it
		if err != nil {
			return nil, err
		}
		out = append(out, memoryContender{
			decide: func(ctx context.Context, key string) (bool, error) {
				r, err := l.Allow(ctx, key)
				return r.Allowed, err
			},
			keyOf: l.Key,
		})
	}
	return out, nil
}

// aloneGCRA is the index of "GCRA, no coalescing" in contenders.
const aloneGCRA = 7

// goSideContenders picks, from contenders, the ones whose Go-side cost is
// measured: redis_rate's, our GCRA and TokenBucket, and GCRA without
// coalescing.
func goSideContenders(cs []contender) []contender {
	return []contender{cs[0], cs[1], cs[2], cs[aloneGCRA]}
}

// theirsAt is redis_rate at p's rate and burst.
func theirsAt(rdb redis.UniversalClient, p throttle.GCRA) contender {
	l := redis_rate.NewLimiter(rdb)
	limit := redis_rate.Limit{Rate: p.Rate.N, Burst: p.Burst, Period: p.Rate.Per}
	return contender{name: "redis_rate GCRA", decide: func(ctx context.Context, key string) (bool, error) {
		res, err := l.Allow(ctx, key, limit)
		if err != nil {
			return false, err
		}
		return res.Allowed > 0, nil
	}}
}
