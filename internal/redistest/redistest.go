// Package redistest gives tests a Redis to run against: an embedded
// miniredis by default, the server at REDIS_ADDR when that is set, or the
// Redis Cluster at REDIS_CLUSTER_ADDRS (comma-separated host:port seeds).
//
// Every Target has a key prefix of its own, and on a real server the keys
// under it are deleted when the test ends; nothing is ever flushed. Tests
// that are about time use [Embedded] and its [Clock], which drives
// miniredis's TIME and TTLs together.
package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/redis/go-redis/v9"
)

// FarWindow is a fixed window's length that does not turn while a test
// runs. Fixed windows are aligned to the Unix epoch, so an hour's window
// turns at every whole hour of the wall clock: a test that counts what one
// window admits, run across 09:00:00, saw two windows' worth.
const FarWindow = 10 * 365 * 24 * time.Hour

// Target is one test's Redis: a client, and the miniredis behind it when it
// is embedded.
type Target struct {
	// Client is the test's connection pool.
	Client redis.UniversalClient
	// Mini is the embedded server, nil on a real Redis.
	Mini *miniredis.Miniredis
	// Prefix is unique to this Target; put every key under it.
	Prefix string
	// Kind is "miniredis", "redis" or "cluster" (or what Connect was given).
	Kind string

	connect func() redis.UniversalClient
}

// New returns the Redis chosen by the environment: REDIS_CLUSTER_ADDRS,
// then REDIS_ADDR, else an embedded miniredis.
func New(tb testing.TB) *Target {
	tb.Helper()
	if seeds := os.Getenv("REDIS_CLUSTER_ADDRS"); seeds != "" {
		addrs := strings.Split(seeds, ",")
		return dial(tb, "cluster", func() redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		})
	}
	if addr := os.Getenv("REDIS_ADDR"); addr != "" {
		return dial(tb, "redis", func() redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: addr})
		})
	}
	return Embedded(tb)
}

// Embedded returns a fresh miniredis for this test, whatever the
// environment says: for tests that drive the clock.
func Embedded(tb testing.TB) *Target {
	tb.Helper()
	m := miniredis.RunT(tb)
	t := &Target{Mini: m, Prefix: prefix(tb), Kind: "miniredis", connect: func() redis.UniversalClient {
		return redis.NewClient(&redis.Options{Addr: m.Addr()})
	}}
	t.Client = t.NewClient(tb)
	return t
}

// Connect returns a Target on a Redis of the test's own making, of the given
// kind ("redis", "cluster", "sentinel"), whose clients connect opens; the
// keys under its prefix are deleted when the test ends.
func Connect(tb testing.TB, kind string, connect func() redis.UniversalClient) *Target {
	tb.Helper()
	return dial(tb, kind, connect)
}

func dial(tb testing.TB, kind string, connect func() redis.UniversalClient) *Target {
	tb.Helper()
	t := &Target{Prefix: prefix(tb), Kind: kind, connect: connect}
	t.Client = t.NewClient(tb)
	if err := t.Client.Ping(context.Background()).Err(); err != nil {
		tb.Fatalf("redistest: %s from the environment does not answer: %v", kind, err)
	}
	tb.Cleanup(func() { t.deleteKeys(tb) })
	return t
}

// Real reports whether the Target is a real server rather than miniredis.
func (t *Target) Real() bool { return t.Mini == nil }

// NewClient opens another connection pool to the same Redis, closed when
// the test ends: a stand-in for a second process.
func (t *Target) NewClient(tb testing.TB) redis.UniversalClient {
	tb.Helper()
	c := t.connect()
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Keys returns every key under the Target's prefix, scanning each master of
// a cluster, but the registry of limiter names (keyspace.Registry): a
// record of which limiters exist, written on their first decision, not
// state of theirs.
func (t *Target) Keys(tb testing.TB) []string {
	tb.Helper()
	ctx := context.Background()
	var keys []string
	scan := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, t.Prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			if iter.Val() != keyspace.Registry(t.Prefix) {
				keys = append(keys, iter.Val())
			}
		}
		return iter.Err()
	}
	var err error
	switch c := t.Client.(type) {
	case *redis.ClusterClient:
		var mu sync.Mutex
		err = c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			return scan(ctx, node)
		})
	case *redis.Client:
		err = scan(ctx, c)
	default:
		tb.Fatalf("redistest: unexpected client %T", c)
	}
	if err != nil {
		tb.Fatalf("redistest: scanning keys: %v", err)
	}
	return keys
}

func (t *Target) deleteKeys(tb testing.TB) {
	c := t.connect()
	defer c.Close()
	for _, k := range t.Keys(tb) {
		_ = c.Del(context.Background(), k).Err()
	}
}

// prefix returns a key prefix unique to this test and this run.
func prefix(tb testing.TB) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-':
			return r
		}
		return '.'
	}, tb.Name())
	return "jttest:" + name + ":" + hex.EncodeToString(b[:]) + ":"
}

// Clock drives an embedded Redis's clock: TIME and key expiry move together.
// It is not safe for concurrent use.
type Clock struct {
	tb  testing.TB
	m   *miniredis.Miniredis
	now time.Time
}

// Start is where every Clock begins: a Unix time in microseconds that is not
// a round number, so window boundaries are not accidentally aligned with it.
var Start = time.Date(2026, 3, 14, 15, 9, 26, 535897000, time.UTC)

// Clock sets the embedded Redis's clock to [Start] and returns it for
// driving. It fails the test on a real Redis.
func (t *Target) Clock(tb testing.TB) *Clock {
	tb.Helper()
	if t.Mini == nil {
		tb.Fatal("redistest: Clock needs the embedded Redis (use Embedded)")
	}
	c := &Clock{tb: tb, m: t.Mini, now: Start}
	t.Mini.SetTime(Start)
	return c
}

// Now is the Redis server's current time.
func (c *Clock) Now() time.Time { return c.now }

// Advance moves the clock forward by d: TIME and expiries both.
func (c *Clock) Advance(d time.Duration) {
	if d < 0 {
		c.tb.Fatalf("redistest: Advance(%s): the clock only moves forward; use Set", d)
	}
	c.now = c.now.Add(d)
	c.m.SetTime(c.now)
	c.m.FastForward(d)
}

// Set moves the clock to t; when t is later than now, expiries follow.
func (c *Clock) Set(t time.Time) {
	if d := t.Sub(c.now); d > 0 {
		c.Advance(d)
		return
	}
	c.now = t
	c.m.SetTime(t)
}

// ClockOffset estimates how far the Redis server's clock is ahead of this
// process's: TIME, against the middle of its round trip. On one machine
// (miniredis, or a redis-server on loopback) it is a few microseconds.
func ClockOffset(tb testing.TB, client redis.UniversalClient) time.Duration {
	tb.Helper()
	best := time.Duration(1<<63 - 1)
	var offset time.Duration
	for range 5 {
		sent := time.Now()
		server, err := client.Time(context.Background()).Result()
		took := time.Since(sent)
		if err != nil {
			tb.Fatal(err)
		}
		if took < best {
			best, offset = took, server.Sub(sent.Add(took/2))
		}
	}
	return offset
}
