package main

import (
	"context"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/throttle"
)

// TestThrottlectlNoStateListsOthers: peek and reset of a caller key under
// a limiter that holds no state for it name the limiters that do: other
// policies, a block alone, a named limiter, a concurrency cap; not those of
// other caller keys, even ones that match as a pattern would.
func TestThrottlectlNoStateListsOthers(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	ctx := context.Background()
	take(t, c.limiter(throttle.GCRA{Rate: throttle.PerHour(10), Burst: 10}), "tenant-1", 1)
	// An hour's window: a minute's key expired when its window turned over
	// between the take and the peek (CI, 2026-12-03).
	take(t, c.limiter(throttle.FixedWindow{Limit: 25, Window: time.Hour}), "tenant-1", 1)
	blocked := c.limiter(throttle.SlidingWindow{Limit: 5, Window: time.Hour})
	if err := blocked.BlockFor(ctx, "tenant-1", time.Hour); err != nil {
		t.Fatal(err)
	}
	named, err := throttle.New(c.tg.Client, "partner-api", throttle.GCRA{Rate: throttle.PerHour(10), Burst: 10},
		throttle.WithPrefix(c.tg.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	take(t, named, "tenant-1", 1)
	acquire(t, c.concurrency(throttle.Concurrency{Limit: 2, Lease: time.Hour}), "tenant-1")
	// Other caller keys: none of theirs may be listed.
	take(t, c.limiter(throttle.SlidingLog{Limit: 3, Window: time.Hour}), "tenant-10", 1)
	take(t, c.limiter(throttle.TokenBucket{Rate: throttle.PerHour(3), Burst: 3}), "tenant-?", 1)
	take(t, c.limiter(throttle.TokenBucket{Rate: throttle.PerHour(4), Burst: 4}), "x{tenant-1}", 1)

	present := "state present under: conc:2/1h0m0s@conc, fw:25/1h@fw, gcra:10/1h:10@gcra, partner-api@gcra, sw:5/1h@sw"
	for _, tc := range []struct {
		name string
		args []string
		says string
	}{
		{"peek, other policy", []string{"peek", "--name", pol("gcra:5/1s:5"), "--policy", "gcra:5/1s:5", "tenant-1"}, `no state for gcra:5/1s:5@gcra key "tenant-1" (Redis key "` + c.tg.Prefix + `gcra:5/1s:5@gcra:{tenant-1}"): it is full; ` + present},
		{"reset, other policy", []string{"reset", "--name", pol("tb:5/s:5"), "--policy", "tb:5/s:5", "tenant-1"}, `no state for tb:5/1s:5@tb key "tenant-1"`},
		{"reset lists too", []string{"reset", "--name", pol("tb:5/s:5"), "--policy", "tb:5/s:5", "tenant-1"}, present},
		{"other name", []string{"peek", "--name", "exports", "--policy", "gcra:10/1h:10", "tenant-1"}, `no state for exports@gcra key "tenant-1"`},
		{"other name lists", []string{"peek", "--name", "exports", "--policy", "gcra:10/1h:10", "tenant-1"}, present},
		{"glob characters", []string{"peek", "--name", pol("tb:3/1h:3"), "--policy", "tb:3/1h:3", "tenant-*"}, `holds state for this key`},
		{"nothing anywhere", []string{"peek", "--name", pol("gcra:5/1s:5"), "--policy", "gcra:5/1s:5", "tenant-2"}, `no limiter under the prefix "` + c.tg.Prefix + `" holds state for this key`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			full(t, c.run(tc.args...), tc.says)
		})
	}
}
