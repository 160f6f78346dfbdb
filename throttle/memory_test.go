package throttle_test

import (
	"cmp"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// TestMemoryPerKey reports MEMORY USAGE of one caller key's state for each
// algorithm, with a 9-byte prefix (as long as the default "throttle:") and
// the 13-byte caller keys "tenant-000001"..., and holds the algorithms to a
// bound. A key's size depends on what it holds at that moment: Redis keeps a
// string value of up to 44 bytes inside the key's own allocation, and the
// allocator rounds sizes to classes 16 bytes apart, so a value one digit
// longer can cost 16 bytes more (SlidingWindow's "<window>:<prev>:<cur>"
// grows from 104 to 120 B as its counts reach two digits). So each is
// measured over what it can hold: after one admission and with the key
// full (and, for SlidingLog, the log full), on five caller keys each. The
// figure is the median key at the fullest, with the range seen: MEMORY
// USAGE itself has read one or two size classes more on a key now and then
// (104 B keys read 136 B once in CI, never twice in a row), so the bound
// holds the median. Each bound is the largest median measured here (Redis
// 7.0.15, jemalloc) plus one size class. Every limiter's state records its
// interval or window, so that a policy changed in code converts what was
// used: a GCRA key reads 120 B and a TokenBucket key 104 B in CI, where
// before limiters had names an unnamed one's read 88 B. MEMORY USAGE needs
// a real Redis.
func TestMemoryPerKey(t *testing.T) {
	tg := redistest.New(t)
	if !tg.Real() {
		t.Skip("needs REDIS_ADDR: miniredis has no MEMORY USAGE")
	}
	rate := throttle.PerSecond(10)
	for _, tc := range []struct {
		policy     throttle.Policy
		fills      []int // units admitted before measuring
		bound      int64
		inAddition string
		name       string // the limiter's name, "l" when empty
	}{
		{throttle.FixedWindow{Limit: 10, Window: time.Minute}, []int{1, 10}, 104 + 16, "", ""},
		{throttle.SlidingWindow{Limit: 10, Window: time.Minute}, []int{1, 9, 10}, 120 + 16, "", ""},
		{throttle.TokenBucket{Rate: rate, Burst: 10}, []int{1, 10}, 104 + 16, "", ""},
		{throttle.LeakyBucket{Rate: rate, Capacity: 10}, []int{1, 10}, 120 + 16, "", ""},
		{throttle.GCRA{Rate: rate, Burst: 10}, []int{1, 10}, 120 + 16, "", ""},
		{throttle.GCRA{Rate: throttle.Rate{N: 7, Per: 1500 * time.Microsecond}, Burst: 10}, []int{1, 10}, 120 + 16, " (an interval of 214 2/7 µs: a remainder is kept)", ""},
		{throttle.SlidingLog{Limit: 10, Window: time.Minute}, []int{10}, 408 + 16, "", ""},
		{throttle.GCRA{Rate: rate, Burst: 10}, []int{1, 10}, 120 + 16, ", named \"partner\"", "partner"},
		{throttle.FixedWindow{Limit: 10, Window: time.Minute}, []int{1, 10}, 120 + 16, ", named \"partner\"", "partner"},
	} {
		// The last 9 bytes of the test's prefix: random, ending in ':'.
		opts := []throttle.Option{throttle.WithPrefix(tg.Prefix[len(tg.Prefix)-9:])}
		name := cmp.Or(tc.name, "l")
		l, err := throttle.New(tg.Client, name, tc.policy, opts...)
		if err != nil {
			t.Fatal(err)
		}
		least, most, typical := int64(1<<62), int64(0), int64(0)
		for _, fill := range tc.fills {
			var sizes []int64
			for k := range 5 {
				key := fmt.Sprintf("tenant-%06d", fill*10+k)
				allowN(t, l, key, fill)
				bytes, err := tg.Client.MemoryUsage(t.Context(), l.Key(key)).Result()
				_ = l.Reset(t.Context(), key)
				if err != nil {
					t.Fatal(err)
				}
				sizes = append(sizes, bytes)
				least, most = min(least, bytes), max(most, bytes)
			}
			slices.Sort(sizes)
			typical = max(typical, sizes[len(sizes)/2])
		}
		bound := tc.bound
		if tg.Kind == "cluster" {
			// A cluster node links each key into its slot's key list: 16
			// more bytes per key (Redis 7.0), whatever the algorithm.
			bound += 16
		}
		t.Logf("figures: %-60s %3d bytes per key (seen %d to %d) after admitting %v units%s", describe(tc.policy), typical, least, most, tc.fills, tc.inAddition)
		if typical > bound {
			t.Errorf("%s: %d bytes per key, bound %d", describe(tc.policy), typical, bound)
		}
	}
}
