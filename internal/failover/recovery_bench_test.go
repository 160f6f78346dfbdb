//go:build failover

package failover

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/redisclient"
	"github.com/redis/go-redis/v9"
)

// BenchmarkAsynqRecovery measures a plain asynq fleet (two servers of 10
// workers, each on a ClusterClient of its own with go-redis's defaults,
// handlers of 100 ms) through the kill of the master that holds its queue,
// on a Cluster with a replica per master; the old master stays down. With
// "follow", each client reloads its slot map on failures as the library's
// constructors make it (redisclient.FollowFailovers); with "defaults", it
// does not. Reported: how long no task started after the kill, and tasks
// started per second in the 10 s after it (the fleet's rate before it is
// about 200/s). Run with -benchtime=1x: one iteration is one failover.
//
//	go test -tags failover -run '^$' -bench AsynqRecovery -benchtime=1x ./internal/failover/
func BenchmarkAsynqRecovery(b *testing.B) {
	for _, follow := range []bool{true, false} {
		name := "defaults"
		if follow {
			name = "follow"
		}
		b.Run(name, func(b *testing.B) {
			for range b.N {
				pause, after, before := asynqRecovery(b, follow)
				b.ReportMetric(pause.Seconds(), "s-paused")
				b.ReportMetric(after, "tasks/s-after")
				b.ReportMetric(before, "tasks/s-before")
			}
		})
	}
}

func asynqRecovery(b *testing.B, follow bool) (pause time.Duration, after, before float64) {
	c := startCluster(b)
	newClient := func() *redis.ClusterClient {
		client := c.client(b)
		if follow {
			redisclient.FollowFailovers(client)
		}
		return client
	}
	const queue = "recovery"
	victim, replica := c.masterAndReplica(queue)
	var mu sync.Mutex
	var starts []time.Time
	for range 2 {
		srv := asynq.NewServerFromRedisClient(newClient(), asynq.Config{
			Concurrency: 10, Queues: map[string]int{queue: 1}, LogLevel: asynq.FatalLevel, ShutdownTimeout: time.Second,
		})
		b.Cleanup(srv.Shutdown)
		if err := srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
			mu.Lock()
			starts = append(starts, time.Now())
			mu.Unlock()
			time.Sleep(100 * time.Millisecond)
			return nil
		})); err != nil {
			b.Fatal(err)
		}
	}
	enqueuer := asynq.NewClientFromRedisClient(newClient())
	const tasks = 20000 // about 100 s of work at 200/s
	for i := range tasks {
		if _, err := enqueuer.Enqueue(asynq.NewTask("work", []byte(fmt.Sprint(i))), asynq.Queue(queue)); err != nil {
			b.Fatal(err)
		}
	}
	replicated(b, victim, replica)
	time.Sleep(5 * time.Second)
	count := func(from, to time.Time) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, at := range starts {
			if !at.Before(from) && at.Before(to) {
				n++
			}
		}
		return n
	}
	killed := time.Now()
	before = float64(count(killed.Add(-3*time.Second), killed)) / 3
	victim.kill()
	// Wait until tasks start again (or 90 s: go-redis reloads its map
	// every 60 s by default), then 10 s more.
	deadline := killed.Add(90 * time.Second)
	for count(killed.Add(time.Second), time.Now()) == 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(10 * time.Second)
	mu.Lock()
	last := killed
	for _, at := range starts {
		if at.After(killed) {
			pause = max(pause, at.Sub(last))
			last = at
		}
	}
	mu.Unlock()
	after = float64(count(killed, killed.Add(10*time.Second))) / 10
	return pause, after, before
}
