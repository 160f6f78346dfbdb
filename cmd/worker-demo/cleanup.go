package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// The demo's keys. Its id names both its jobthrottle prefix and its asynq
// queue, so that every key it creates matches one of two SCAN patterns and
// none of another program's.
func demoPrefix(id string) string { return "jtdemo:" + id + ":" }
func demoQueue(id string) string  { return "demo-" + id }

// keyPatterns are the SCAN patterns of every key the demo creates: the
// limiters', the worker's and the scheduler's under the prefix, and asynq's
// of the queue (its tasks, lists, lease, the processed and failed totals
// and their per-day counters). The id is hex, so neither holds a glob
// character.
func keyPatterns(id string) []string {
	return []string{demoPrefix(id) + "*", "asynq:{" + demoQueue(id) + "}*"}
}

// Keys asynq shares between every queue and server on a Redis: the demo
// removes only its own entries from them.
const (
	asynqQueues  = "asynq:queues"  // SET of queue names
	asynqServers = "asynq:servers" // ZSET of server info keys
	asynqWorkers = "asynq:workers" // ZSET of worker keys
)

// cleanupTimeout bounds the removal of the demo's keys.
const cleanupTimeout = 10 * time.Second

// removeKeys deletes every key the demo created, with SCAN (never KEYS), on
// every master when rdb is a Cluster client, once the fleet has stopped. It
// returns how many keys it deleted.
func (d *demo) removeKeys(ctx context.Context) (int, error) {
	var errs []error
	// asynq's servers remove their own entries when they shut down; one
	// that could not (Redis failed meanwhile) is removed here.
	var servers []*asynq.ServerInfo
	if d.inspector != nil {
		servers, _ = d.inspector.Servers()
	}
	for _, s := range servers {
		if _, ours := s.Queues[d.queue]; !ours || len(s.Queues) != 1 {
			continue
		}
		info := fmt.Sprintf("asynq:servers:{%s:%d:%s}", s.Host, s.PID, s.ID)
		work := fmt.Sprintf("asynq:workers:{%s:%d:%s}", s.Host, s.PID, s.ID)
		errs = append(errs, d.rdb.ZRem(ctx, asynqServers, info).Err(), d.rdb.ZRem(ctx, asynqWorkers, work).Err(),
			d.rdb.Del(ctx, info).Err(), d.rdb.Del(ctx, work).Err())
	}
	errs = append(errs, d.rdb.SRem(ctx, asynqQueues, d.queue).Err())
	deleted := 0
	for _, pattern := range keyPatterns(d.id) {
		n, err := scanDelete(ctx, d.rdb, pattern)
		deleted += n
		errs = append(errs, err)
	}
	return deleted, errors.Join(errs...)
}

// scanDelete deletes the keys matching pattern, on every master of a
// Cluster.
func scanDelete(ctx context.Context, rdb redis.UniversalClient, pattern string) (int, error) {
	var mu sync.Mutex
	deleted := 0
	err := eachMaster(ctx, rdb, func(ctx context.Context, node redis.Cmdable) error {
		n, err := scanDeleteOn(ctx, node, pattern)
		mu.Lock()
		deleted += n
		mu.Unlock()
		return err
	})
	return deleted, err
}

// eachMaster runs fn on rdb, or on every master of a Cluster client
// (concurrently).
func eachMaster(ctx context.Context, rdb redis.UniversalClient, fn func(context.Context, redis.Cmdable) error) error {
	if c, ok := rdb.(*redis.ClusterClient); ok {
		return c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error { return fn(ctx, node) })
	}
	return fn(ctx, rdb)
}

// scanDeleteOn deletes the keys matching pattern on one server, a page at
// a time. Each key is deleted on its own: in a Cluster the keys of a page
// may lie in different slots.
func scanDeleteOn(ctx context.Context, rdb redis.Cmdable, pattern string) (int, error) {
	deleted := 0
	var cursor uint64
	for {
		keys, next, err := rdb.Scan(ctx, cursor, pattern, 500).Result()
		if err != nil {
			return deleted, fmt.Errorf("scanning %s: %w", pattern, err)
		}
		for _, key := range keys {
			n, err := rdb.Del(ctx, key).Result()
			if err != nil {
				return deleted, fmt.Errorf("deleting %s: %w", key, err)
			}
			deleted += int(n)
		}
		if cursor = next; cursor == 0 {
			return deleted, nil
		}
	}
}
