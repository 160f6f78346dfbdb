package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// connect opens the Redis the global flags name and checks that it
// answers. The caller closes the client.
func (a *app) connect(ctx context.Context) (redis.UniversalClient, error) {
	single, cluster, err := a.redisOptions()
	if err != nil {
		return nil, err
	}
	var client redis.UniversalClient
	what := "Redis"
	if cluster != nil {
		client, what = redis.NewClusterClient(cluster), "Redis Cluster"
	} else {
		client = redis.NewClient(single)
	}
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	if err := client.Ping(ctx).Err(); err != nil {
		_ = client.Close()
		var refused redis.Error
		if errors.As(err, &refused) {
			// It answered: a wrong password or user, a database that does
			// not exist, a server that is not a Cluster.
			return nil, fmt.Errorf("%s at %s refused the connection: %w", what, a.redis.String(), err)
		}
		return nil, fmt.Errorf("cannot reach %s at %s: %w", what, a.redis.String(), err)
	}
	return client, nil
}

// scanCount is the COUNT hint of each SCAN: how many keys Redis looks at
// per call.
const scanCount = 1000

// scanPrefix returns every key that starts with prefix, found with SCAN
// (never KEYS, which blocks the server) on the server or on every master of
// a Cluster. Each SCAN call gets the --timeout; SCAN may return a key more
// than once, the result has each once.
func (a *app) scanPrefix(ctx context.Context, client redis.UniversalClient) ([]string, error) {
	return a.scanMatch(ctx, client, globEscape(a.prefix)+"*")
}

// scanMatch returns the keys under the prefix that match pattern, a SCAN
// MATCH pattern, found as scanPrefix finds them.
func (a *app) scanMatch(ctx context.Context, client redis.UniversalClient, pattern string) ([]string, error) {
	var mu sync.Mutex
	seen := map[string]bool{}
	var keys []string
	scan := func(ctx context.Context, node *redis.Client) error {
		var cursor uint64
		for {
			callCtx, cancel := context.WithTimeout(ctx, a.timeout)
			page, next, err := node.Scan(callCtx, cursor, pattern, scanCount).Result()
			cancel()
			if err != nil {
				return fmt.Errorf("scanning %s: %w", node.Options().Addr, err)
			}
			mu.Lock()
			for _, k := range page {
				if !seen[k] && strings.HasPrefix(k, a.prefix) {
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
		// ForEachMaster runs scan on the masters concurrently.
		if err := c.ForEachMaster(ctx, scan); err != nil {
			return nil, err
		}
	case *redis.Client:
		if err := scan(ctx, c); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("cannot scan a %T", client)
	}
	return keys, nil
}

// globEscape escapes the characters SCAN's MATCH pattern gives a meaning,
// so that the prefix matches only itself.
func globEscape(s string) string {
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
