package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
)

// goSide is the Go-side cost of one decision: ns, bytes and allocations per
// op, with RunParallel, as testing reports them.
type goSide struct {
	nsPerOp, bytesPerOp, allocsPerOp int64
}

func measureGoSide(decide func(context.Context, string) (bool, error), keys []string) goSide {
	var next atomic.Int64
	r := testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := decide(context.Background(), keys[int(next.Add(1))%len(keys)]); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	return goSide{r.NsPerOp(), r.AllocedBytesPerOp(), r.AllocsPerOp()}
}

// serverTimes measures each contender's server microseconds per script
// call in rounds of calls decisions over keys, the contenders rotated each
// round so that drift on a shared machine falls on all alike, and returns
// each one's median over the rounds.
func serverTimes(ctx context.Context, rdb *redis.Client, cs []contender, keys []string, rounds, calls int) ([]float64, error) {
	per := make([][]float64, len(cs))
	for round := range rounds {
		for j := range cs {
			k := (j + round) % len(cs)
			usec, err := serverMicros(ctx, rdb, cs[k].decide, keys, calls)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", cs[k].name, err)
			}
			per[k] = append(per[k], usec)
		}
	}
	medians := make([]float64, len(cs))
	for k, times := range per {
		slices.Sort(times)
		medians[k] = times[len(times)/2]
	}
	return medians, nil
}

// serverMicros runs calls decisions and returns the server's microseconds
// per script call (EVALSHA and EVAL together), from INFO commandstats.
func serverMicros(ctx context.Context, rdb *redis.Client, decide func(context.Context, string) (bool, error), keys []string, calls int) (float64, error) {
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		return 0, err
	}
	for i := range calls {
		if _, err := decide(ctx, keys[i%len(keys)]); err != nil {
			return 0, err
		}
	}
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	var n, usec float64
	for _, line := range strings.Split(info, "\n") {
		if !strings.HasPrefix(line, "cmdstat_evalsha:") && !strings.HasPrefix(line, "cmdstat_eval:") {
			continue
		}
		for _, field := range strings.Split(strings.TrimSpace(line[strings.IndexByte(line, ':')+1:]), ",") {
			name, value, _ := strings.Cut(field, "=")
			v, _ := strconv.ParseFloat(value, 64)
			switch name {
			case "calls":
				n += v
			case "usec":
				usec += v
			}
		}
	}
	if n == 0 {
		return 0, fmt.Errorf("no script calls in commandstats")
	}
	return usec / n, nil
}

// memory is what one key's state costs Redis.
type memory struct {
	usage     int64   // MEMORY USAGE of one key
	perKey    float64 // used_memory growth over many keys, per key
	exampleOf string  // the key measured
}

// measureMemory takes one decision on each of keys and reports MEMORY
// USAGE of the first and the growth of used_memory per key.
func measureMemory(ctx context.Context, rdb *redis.Client, decide func(context.Context, string) (bool, error), keys []string, redisKeyOf func(string) string) (memory, error) {
	before, err := usedMemory(ctx, rdb)
	if err != nil {
		return memory{}, err
	}
	for _, k := range keys {
		if _, err := decide(ctx, k); err != nil {
			return memory{}, err
		}
	}
	after, err := usedMemory(ctx, rdb)
	if err != nil {
		return memory{}, err
	}
	key := redisKeyOf(keys[0])
	usage, err := rdb.MemoryUsage(ctx, key).Result()
	if err != nil {
		return memory{}, fmt.Errorf("MEMORY USAGE %s: %w", key, err)
	}
	return memory{usage: usage, perKey: float64(after-before) / float64(len(keys)), exampleOf: key}, nil
}

func usedMemory(ctx context.Context, rdb *redis.Client) (int64, error) {
	info, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("no used_memory in INFO memory")
}
