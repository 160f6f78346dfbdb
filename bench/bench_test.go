package main

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// testRedis returns a client of REDIS_ADDR, or of an embedded miniredis.
func testRedis(b *testing.B) redis.UniversalClient {
	b.Helper()
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		addr = miniredis.RunT(b).Addr()
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
	b.Cleanup(func() { rdb.Close() })
	return rdb
}

// BenchmarkDecision is the Go side's cost of one decision, redis_rate's
// and ours side by side: ns/op (with the round trip to the Redis), B/op and
// allocs/op.
//
//	cd bench && REDIS_ADDR=127.0.0.1:6379 go test -run '^$' -bench Decision
func BenchmarkDecision(b *testing.B) {
	rdb := testRedis(b)
	cs, err := contenders(rdb, "jtbench:go:")
	if err != nil {
		b.Fatal(err)
	}
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = fmt.Sprintf("jtbench:go:tenant-%06d", i)
	}
	for _, c := range goSideContenders(cs) {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			var next atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := c.decide(context.Background(), keys[int(next.Add(1))%len(keys)]); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
