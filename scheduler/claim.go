package scheduler

import (
	"context"
	"time"

	"github.com/jobthrottle/jobthrottle/lua"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

var tickClaimScript = redis.NewScript(lua.TickClaim)

// Claim modes of tick_claim.lua.
const (
	claimTake   = "0"
	claimRenew  = "1"
	claimFinish = "2"
)

// Claim lifetimes: a running claim is a lease renewed while the batch is
// produced; a finished one is remembered long enough that no replica runs
// the tick again.
const (
	claimLease = 30 * time.Second
	claimDone  = 24 * time.Hour
)

// claimKey is the Redis key of one tick of one entry.
func (s *Scheduler) claimKey(entry string, tick time.Time) string {
	return s.cfg.prefix + "sched:" + throttle.Tag(entry) + ":" + tick.UTC().Format(time.RFC3339Nano)
}

// claim runs the claim script; true means the claim is ours.
func (s *Scheduler) claim(ctx context.Context, key, mode string, ttl time.Duration) (bool, error) {
	n, err := tickClaimScript.Run(ctx, s.client, []string{key}, mode, s.replica, ttl.Milliseconds()).Int()
	return n == 1, err
}

// keepClaim renews a claim every third of its lease until done is closed.
func (s *Scheduler) keepClaim(key string, done <-chan struct{}) {
	ticker := time.NewTicker(claimLease / 3)
	defer ticker.Stop()
	for {
		select {
		case <-done:
			return
		case <-ticker.C:
			ctx, cancel := context.WithTimeout(context.Background(), claimLease/3)
			_, _ = s.claim(ctx, key, claimRenew, claimLease)
			cancel()
		}
	}
}
