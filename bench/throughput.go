package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// cell is the measurement of one contender at one concurrency on one key
// set: decisions and their latencies.
type cell struct {
	decisions int
	elapsed   time.Duration
	latencies []time.Duration
	errors    int
}

func (c cell) rate() float64 { return float64(c.decisions) / c.elapsed.Seconds() }

func (c cell) percentile(p float64) time.Duration {
	if len(c.latencies) == 0 {
		return 0
	}
	return c.latencies[int(float64(len(c.latencies)-1)*p)]
}

// run drives decide from goroutines workers for d, over keys, and adds what
// it saw to c.
func (c *cell) run(decide func(context.Context, string) (bool, error), workers int, keys []string, d time.Duration) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	stop := start.Add(d)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lat []time.Duration
			errs := 0
			for i := w; ; i += workers {
				t0 := time.Now()
				if t0.After(stop) {
					break
				}
				if _, err := decide(context.Background(), keys[i%len(keys)]); err != nil {
					errs++
				}
				lat = append(lat, time.Since(t0))
			}
			mu.Lock()
			c.latencies = append(c.latencies, lat...)
			c.decisions += len(lat)
			c.errors += errs
			mu.Unlock()
		}()
	}
	wg.Wait()
	c.elapsed += time.Since(start)
}

// throughput measures every contender at each concurrency on a hot key and
// on many keys, side by side: each cell's time is split in rounds, and each
// round runs the contenders in a rotated order, so that drift on a shared
// machine falls on all alike.
func throughput(cs []contender, concurrency []int, keySets map[string][]string, perCell time.Duration, rounds int) map[string]map[int][]cell {
	out := map[string]map[int][]cell{}
	for _, set := range []string{"1 hot key", fmt.Sprintf("%d keys", len(keySets["many"]))} {
		keys := keySets["hot"]
		if set != "1 hot key" {
			keys = keySets["many"]
		}
		out[set] = map[int][]cell{}
		for _, workers := range concurrency {
			cells := make([]cell, len(cs))
			for round := range rounds {
				for j := range cs {
					k := (j + round) % len(cs)
					cells[k].run(cs[k].decide, workers, keys, perCell/time.Duration(rounds))
				}
			}
			for k := range cells {
				slices.Sort(cells[k].latencies)
			}
			out[set][workers] = cells
		}
	}
	return out
}
