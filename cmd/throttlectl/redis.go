package main

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// connect opens the Redis the global flags name and checks that it
// answers. The caller closes the client.
func (a *app) connect(ctx context.Context) (redis.UniversalClient, error) {
	addrs, err := a.addrs()
	if err != nil {
		return nil, err
	}
	var client redis.UniversalClient
	if a.cluster {
		client = redis.NewClusterClient(&redis.ClusterOptions{
			Addrs:                 addrs,
			DialTimeout:           a.timeout,
			ReadTimeout:           a.timeout,
			WriteTimeout:          a.timeout,
			ContextTimeoutEnabled: true,
		})
	} else {
		client = redis.NewClient(&redis.Options{
			Addr:                  addrs[0],
			DialTimeout:           a.timeout,
			ReadTimeout:           a.timeout,
			WriteTimeout:          a.timeout,
			ContextTimeoutEnabled: true,
		})
	}
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	if err := client.Ping(ctx).Err(); err != nil {
		_ = client.Close()
		what := "Redis"
		if a.cluster {
			what = "Redis Cluster"
		}
		return nil, fmt.Errorf("cannot reach %s at %s: %w", what, a.redisAddr, err)
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
	pattern := globEscape(a.prefix) + "*"
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
