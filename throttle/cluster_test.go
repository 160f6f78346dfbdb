package throttle_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// TestClusterSpreadsKeys writes the state of 10,000 caller keys, in
// AllowMany batches, and counts where they landed: on a Redis Cluster each
// master holds a fair share (every one at least a quarter of the keys with
// three masters), with no CROSSSLOT error along the way; on one server, the
// same with 2,000 keys (what it checks there, every key written once with a
// TTL, needs no more): all are there, each with a TTL.
func TestClusterSpreadsKeys(t *testing.T) {
	tg := redistest.New(t)
	l := newLimiter(t, tg, throttle.GCRA{Rate: throttle.PerHour(10), Burst: 5}) // keys live 6 min
	ctx := context.Background()
	keys := 10_000
	if _, cluster := tg.Client.(*redis.ClusterClient); !cluster {
		keys = 2_000
	}
	for start := 0; start < keys; start += 500 {
		batch := make([]throttle.Request, 500)
		for i := range batch {
			batch[i] = throttle.Request{Key: "tenant-" + itoa(start+i), N: 1}
		}
		results, err := l.AllowMany(ctx, batch)
		if err != nil {
			t.Fatalf("AllowMany: %v", err)
		}
		for i, r := range results {
			if !r.Allowed {
				t.Fatalf("%s: first request rejected: %+v", batch[i].Key, r)
			}
		}
	}
	cluster, ok := tg.Client.(*redis.ClusterClient)
	if !ok {
		if n := len(tg.Keys(t)); n != keys {
			t.Fatalf("%d keys written for %d caller keys", n, keys)
		}
		checkTTLs(t, tg)
		t.Logf("figures: %s: %d caller keys, %d Redis keys, one node", tg.Kind, keys, keys)
		return
	}
	perMaster := keysPerMaster(t, cluster, tg.Prefix, func(key string) bool {
		return key != keyspace.Registry(tg.Prefix) // the registry of names
	})
	total := 0
	for _, n := range perMaster {
		total += n
	}
	t.Logf("figures: cluster: %d caller keys over %d masters: %v", keys, len(perMaster), perMaster)
	if total != keys {
		t.Fatalf("%d keys found on the masters, want %d", total, keys)
	}
	for addr, n := range perMaster {
		if n < keys/(len(perMaster)+1) {
			t.Fatalf("master %s holds %d of %d keys: not spread", addr, n, keys)
		}
	}
	checkTTLs(t, tg)
}

// TestTaggedPrefixKeepsOneSlot: under a prefix holding a hash tag
// ("…{jobs}:"), a limiter's keys for 200 caller keys, with their blocks,
// are all on one master of a Cluster (one slot), where without the tag
// they spread (TestClusterSpreadsKeys): the price of one round trip per
// task is that one node does all of that limiter's work.
func TestTaggedPrefixKeepsOneSlot(t *testing.T) {
	tg := redistest.New(t)
	prefix := tg.Prefix + "{jobs}:"
	l, err := throttle.New(tg.Client, "tagged", throttle.GCRA{Rate: throttle.PerHour(10), Burst: 5}, throttle.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const keys = 200
	for i := range keys {
		if r, err := l.Allow(ctx, "tenant-"+itoa(i)); err != nil || !r.Allowed {
			t.Fatalf("tenant-%d: %+v, %v", i, r, err)
		}
		if i%10 == 0 {
			if err := l.BlockFor(ctx, "tenant-"+itoa(i), time.Minute); err != nil {
				t.Fatal(err)
			}
		}
	}
	cluster, ok := tg.Client.(*redis.ClusterClient)
	if !ok {
		if n := len(tg.Keys(t)); n < keys {
			t.Fatalf("%d keys written for %d caller keys", n, keys)
		}
		return
	}
	perMaster := keysPerMaster(t, cluster, prefix, func(string) bool { return true })
	t.Logf("figures: cluster: %d caller keys under %q over %d masters: %v", keys, "{jobs}", len(perMaster), perMaster)
	holding := 0
	for _, n := range perMaster {
		if n > 0 {
			holding++
		}
	}
	if holding != 1 {
		t.Fatalf("the keys under a tagged prefix are on %d masters, want 1: %v", holding, perMaster)
	}
}

// keysPerMaster counts, on each master of cluster, the keys under prefix
// that count accepts.
func keysPerMaster(t *testing.T, cluster *redis.ClusterClient, prefix string, count func(key string) bool) map[string]int {
	t.Helper()
	var mu sync.Mutex
	perMaster := map[string]int{}
	err := cluster.ForEachMaster(context.Background(), func(ctx context.Context, node *redis.Client) error {
		n := 0
		iter := node.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			if count(iter.Val()) {
				n++
			}
		}
		mu.Lock()
		perMaster[node.Options().Addr] = n
		mu.Unlock()
		return iter.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	return perMaster
}
