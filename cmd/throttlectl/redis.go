package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/jobthrottle/jobthrottle/internal/scan"
	"github.com/redis/go-redis/v9"
)

// connect opens the Redis the global flags name and checks that it
// answers. The caller closes the client.
func (a *app) connect(ctx context.Context) (redis.UniversalClient, error) {
	opts, err := a.redisOptions()
	if err != nil {
		return nil, err
	}
	client, what := opts.NewClient(), opts.Kind()
	pingCtx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	if err := client.Ping(pingCtx).Err(); err != nil {
		_ = client.Close()
		var refused redis.Error
		if errors.As(err, &refused) {
			// It answered: a wrong password or user, a database that does
			// not exist, a server that is not a Cluster.
			return nil, fmt.Errorf("%s at %s refused the connection: %w", what, a.redis.String(), err)
		}
		return nil, fmt.Errorf("cannot reach %s at %s: %w", what, a.redis.String(), err)
	}
	if plain, ok := client.(*redis.Client); ok {
		// A plain connection to one node sees that node's keys only, and
		// is refused the others' (MOVED). A server that does not say is
		// taken as one server.
		node, err := scan.ClusterNode(ctx, plain, a.timeout)
		if err != nil {
			// Taken as one server, a Cluster node would show its own keys
			// only: better no answer than half of one.
			_ = client.Close()
			return nil, fmt.Errorf("cannot tell whether the Redis at %s is a node of a Redis Cluster: %w", a.redis.String(), err)
		}
		if node {
			_ = client.Close()
			return nil, usagef("the Redis at %s is a node of a Redis Cluster: give --cluster (seeds of the Cluster), or throttlectl sees this node's keys only", a.redis.String())
		}
	}
	return client, nil
}

// scanPrefix returns every key that starts with the prefix, found with
// SCAN on the server or on every master of a Cluster, each call within the
// --timeout.
func (a *app) scanPrefix(ctx context.Context, client redis.UniversalClient) ([]string, error) {
	return scan.Prefix(ctx, client, a.prefix, a.timeout)
}

// scanMatch returns the keys under the prefix that match pattern, a SCAN
// MATCH pattern, found as scanPrefix finds them.
func (a *app) scanMatch(ctx context.Context, client redis.UniversalClient, pattern string) ([]string, error) {
	return scan.Match(ctx, client, pattern, a.prefix, a.timeout)
}
