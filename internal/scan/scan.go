// Package scan finds keys with SCAN, never KEYS (which blocks the server),
// on one Redis server or on every master of a Redis Cluster: for
// throttlectl and the dashboard. Its functions are safe for concurrent use.
package scan

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/bounded"
	"github.com/redis/go-redis/v9"
)

// ErrClusterNode reports a plain client on a node of a Redis Cluster, which
// would see that node's keys only.
var ErrClusterNode = errors.New("the Redis is a node of a Redis Cluster: scanning it alone finds that node's keys only; give a *redis.ClusterClient (redis.NewClusterClient, or throttlectl --cluster)")

// ClusterNode reports whether the server node talks to has cluster mode on
// (INFO cluster); false when it answers without saying (an ACL without
// INFO, miniredis). It fails when the server does not answer within
// perCall, as a SCAN call would.
func ClusterNode(ctx context.Context, node *redis.Client, perCall time.Duration) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, perCall)
	defer cancel()
	var info string
	err := bounded.Call(ctx, func(ctx context.Context) error {
		var err error
		info, err = node.Info(ctx, "cluster").Result()
		return err
	})
	var answer redis.Error
	if errors.As(err, &answer) {
		return false, nil
	}
	return strings.Contains(info, "cluster_enabled:1"), err
}

// Count is the COUNT hint of each SCAN: how many keys Redis looks at per
// call.
const Count = 1000

// Prefix returns every key that starts with prefix, each call bounded by
// perCall whatever the client's options (see package bounded).
func Prefix(ctx context.Context, client redis.UniversalClient, prefix string, perCall time.Duration) ([]string, error) {
	return Match(ctx, client, GlobEscape(prefix)+"*", prefix, perCall)
}

// Match returns the keys that match pattern, a SCAN MATCH pattern, and
// start with prefix, on the server or on every master of a Cluster
// (concurrently). Each SCAN call gets perCall; SCAN may return a key more
// than once, the result has each once.
func Match(ctx context.Context, client redis.UniversalClient, pattern, prefix string, perCall time.Duration) ([]string, error) {
	var mu sync.Mutex
	seen := map[string]bool{}
	var keys []string
	scan := func(ctx context.Context, node *redis.Client) error {
		var cursor uint64
		for {
			var page []string
			var next uint64
			callCtx, cancel := context.WithTimeout(ctx, perCall)
			err := bounded.Call(callCtx, func(ctx context.Context) error {
				var err error
				page, next, err = node.Scan(ctx, cursor, pattern, Count).Result()
				return err
			})
			cancel()
			if err != nil {
				return fmt.Errorf("scanning %s: %w", node.Options().Addr, err)
			}
			mu.Lock()
			for _, k := range page {
				if !seen[k] && strings.HasPrefix(k, prefix) {
					seen[k] = true
					keys = append(keys, k)
				}
			}
			mu.Unlock()
			if next == 0 {
				return nil
			}
			cursor = next
		}
	}
	switch c := client.(type) {
	case *redis.ClusterClient:
		// ForEachMaster runs scan on the masters concurrently, once it
		// knows them (which asks the cluster, bounded by ctx alone).
		err := bounded.Call(ctx, func(ctx context.Context) error { return c.ForEachMaster(ctx, scan) })
		if err != nil {
			return nil, err
		}
	case *redis.Client:
		cluster, err := ClusterNode(ctx, c, perCall)
		if err != nil {
			return nil, fmt.Errorf("scanning %s: %w", c.Options().Addr, err)
		}
		if cluster {
			return nil, fmt.Errorf("%w: %s", ErrClusterNode, c.Options().Addr)
		}
		if err := scan(ctx, c); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("cannot scan a %T", client)
	}
	return keys, nil
}

// GlobEscape escapes the characters SCAN's MATCH pattern gives a meaning,
// so that s matches only itself.
func GlobEscape(s string) string {
	if !strings.ContainsAny(s, `*?[]\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
