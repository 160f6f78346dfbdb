package throttle_test

import (
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// TestMemoryPerKey reports MEMORY USAGE of one caller key's state for each
// algorithm, with a 9-byte prefix (as long as the default "throttle:") and
// the 13-byte caller key "tenant-000001", after one
// admission (and, for SlidingLog, with the log full), and holds the O(1)
// algorithms to a bound. MEMORY USAGE needs a real Redis.
func TestMemoryPerKey(t *testing.T) {
	tg := redistest.New(t)
	if !tg.Real() {
		t.Skip("needs REDIS_ADDR: miniredis has no MEMORY USAGE")
	}
	rate := throttle.PerSecond(10)
	for _, tc := range []struct {
		policy throttle.Policy
		fill   int
		bound  int64
	}{
		{throttle.FixedWindow{Limit: 10, Window: time.Minute}, 1, 120},
		{throttle.SlidingWindow{Limit: 10, Window: time.Minute}, 1, 120},
		{throttle.TokenBucket{Rate: rate, Burst: 10}, 1, 100},
		{throttle.LeakyBucket{Rate: rate, Capacity: 10}, 1, 130},
		{throttle.GCRA{Rate: rate, Burst: 10}, 1, 100},
		{throttle.SlidingLog{Limit: 10, Window: time.Minute}, 10, 600},
	} {
		// The last 9 bytes of the test's prefix: random, ending in ':'.
		l, err := throttle.New(tg.Client, tc.policy, throttle.WithPrefix(tg.Prefix[len(tg.Prefix)-9:]))
		if err != nil {
			t.Fatal(err)
		}
		const key = "tenant-000001"
		allowN(t, l, key, tc.fill)
		bytes, err := tg.Client.MemoryUsage(t.Context(), l.Key(key)).Result()
		_ = l.Reset(t.Context(), key)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%-72s %4d bytes  %s", describe(tc.policy), bytes, l.Key(key))
		bound := tc.bound
		if tg.Kind == "cluster" {
			// A cluster node links each key into its slot's key list: 16
			// more bytes per key (Redis 7.0), whatever the algorithm.
			bound += 16
		}
		if bytes > bound {
			t.Errorf("%s: %d bytes per key, bound %d", describe(tc.policy), bytes, bound)
		}
	}
}
