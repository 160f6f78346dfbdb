package throttle_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// TestRefusalsAreErrorsUnderEitherPolicy: an answer of Redis that will not
// change by itself (no AUTH, a key of another type, a ClusterClient on a
// server without cluster support) comes back as an error wrapping
// ErrRefused under fail-open as well as fail-closed, never as a degraded
// admission; a Redis out of memory, which frees memory by itself, is an
// outage that fail-open lets through.
func TestRefusalsAreErrorsUnderEitherPolicy(t *testing.T) {
	redistest.QuietRedisLog()
	policy := throttle.GCRA{Rate: throttle.PerSecond(1), Burst: 1}
	type setup func(t *testing.T) (client redis.UniversalClient, prefix string)
	cases := []struct {
		name    string
		setup   setup
		refused bool
	}{
		{"no AUTH", func(t *testing.T) (redis.UniversalClient, string) {
			tg := redistest.Embedded(t)
			tg.Mini.RequireAuth("secret")
			return tg.NewClient(t), tg.Prefix
		}, true},
		{"a key of another type", func(t *testing.T) (redis.UniversalClient, string) {
			tg := redistest.New(t)
			l := newLimiter(t, tg, policy)
			if err := tg.Client.LPush(context.Background(), l.Key("k"), "x").Err(); err != nil {
				t.Fatal(err)
			}
			if err := tg.Client.Expire(context.Background(), l.Key("k"), time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			return tg.Client, tg.Prefix
		}, true},
	}
	if srv := redistest.StartServer(t, redistest.ServerOptions{}); srv.Kind == "redis-server" {
		cases = append(cases,
			struct {
				name    string
				setup   setup
				refused bool
			}{"a ClusterClient on a server without cluster support", func(t *testing.T) (redis.UniversalClient, string) {
				c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srv.Addr}})
				t.Cleanup(func() { c.Close() })
				return c, throttle.DefaultPrefix
			}, true},
			struct {
				name    string
				setup   setup
				refused bool
			}{"out of memory", func(t *testing.T) (redis.UniversalClient, string) {
				c := srv.Client(t, nil)
				if err := c.ConfigSet(context.Background(), "maxmemory", "1").Err(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = c.ConfigSet(context.Background(), "maxmemory", "0").Err() })
				return c, throttle.DefaultPrefix
			}, false})
	} else {
		t.Logf("no redis-server on this machine: the cluster-mode and out-of-memory cases need one (CI has it)")
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			client, prefix := c.setup(t)
			const key = "k"
			for _, failure := range []throttle.FailurePolicy{throttle.FailClosed, throttle.FailOpen} {
				l, err := throttle.New(client, fmt.Sprint(policy), policy, throttle.WithPrefix(prefix), throttle.WithFailurePolicy(failure), throttle.WithLogger(nil))
				if err != nil {
					t.Fatal(err)
				}
				for i := range 3 {
					r, err := l.Allow(context.Background(), key)
					switch {
					case c.refused && (!errors.Is(err, throttle.ErrRefused) || errors.Is(err, throttle.ErrUnavailable) || r.Allowed):
						t.Fatalf("%s, call %d: %+v, %v; want an error wrapping ErrRefused", failure, i, r, err)
					case !c.refused && failure == throttle.FailClosed && !errors.Is(err, throttle.ErrUnavailable):
						t.Fatalf("%s, call %d: %+v, %v; want ErrUnavailable", failure, i, r, err)
					case !c.refused && failure == throttle.FailOpen && (err != nil || !r.Degraded):
						t.Fatalf("%s, call %d: %+v, %v; want a degraded admission", failure, i, r, err)
					}
				}
				if c.refused {
					var answer redis.Error
					_, err := l.Allow(context.Background(), key)
					if !errors.As(err, &answer) {
						t.Fatalf("%v does not wrap Redis's answer", err)
					}
				}
			}
		})
	}
}

// TestAPlainClientOnAClusterNodeIsToldToUseAClusterClient: a *redis.Client
// on one node of a Redis Cluster is refused every key of the other nodes'
// slots (MOVED): the error wraps ErrRefused and names the fix. It needs a
// Cluster (REDIS_CLUSTER_ADDRS, as CI's Cluster pass has).
func TestAPlainClientOnAClusterNodeIsToldToUseAClusterClient(t *testing.T) {
	seeds := os.Getenv("REDIS_CLUSTER_ADDRS")
	if seeds == "" {
		t.Logf("no Redis Cluster (REDIS_CLUSTER_ADDRS): this needs one (CI's Cluster pass has it)")
		return
	}
	seed, _, _ := strings.Cut(seeds, ",")
	plain := redis.NewClient(&redis.Options{Addr: seed})
	t.Cleanup(func() { _ = plain.Close() })
	l, err := throttle.New(plain, "moved", throttle.GCRA{Rate: throttle.PerSecond(1000), Burst: 1000}, throttle.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 { // three masters: some key is on another node
		_, err := l.Allow(context.Background(), fmt.Sprintf("moved-%d", i))
		if err == nil {
			continue
		}
		if !errors.Is(err, throttle.ErrRefused) || !strings.Contains(err.Error(), "redis.NewClusterClient") {
			t.Fatalf("a key on another node: %v; want ErrRefused naming redis.NewClusterClient", err)
		}
		return
	}
	t.Fatal("100 keys, none on another node")
}
