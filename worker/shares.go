package worker

import (
	"context"

	"github.com/jobthrottle/jobthrottle/internal/gate"
)

// A rule whose limiter decides from leased shares
// (throttle.WithLeasedShares) is asked with AllowN before the task's other
// rules: in memory while this process holds a share of the key, without a
// Redis call, and in Redis from what the shares leave otherwise. It books
// nothing and has no waiting room: a task it refuses waits inline for its
// RetryAfter when its inline wait allows, and otherwise goes back to its
// queue for that long plus a spread, as under a window. Units a task took
// in memory are given back to the share when another rule then refuses
// it; units the rest in Redis admitted are not (the rest has no undo),
// which can only admit less.

// sharedTake is what a task took under a rule of leased shares.
type sharedTake struct {
	rule   *Rule
	key    string
	n      int
	leased bool // decided in memory: it can be given back
}

// takeShares asks the task's rules of leased shares, in order. On a
// refusal it gives back what it took and returns the refusal; otherwise
// what it took, and whether a decision was let through degraded (Redis
// unreachable under fail-open).
func (t *Throttler) takeShares(ctx context.Context, tk *task, rules []*Rule, roles []int) ([]sharedTake, bool, *refusal) {
	var taken []sharedTake
	degraded := false
	for i, r := range rules {
		if roles[i] != leasedRate {
			continue
		}
		res, err := r.limiter.AllowN(ctx, tk.keys[i], tk.costs[i])
		if err != nil || !res.Allowed {
			giveBackShares(taken)
			if err != nil {
				return nil, false, &refusal{rule: r, key: tk.keys[i], retryAfter: unavailableBackoff, how: waitOrRetry, err: err}
			}
			return nil, false, &refusal{rule: r, key: tk.keys[i], retryAfter: res.RetryAfter, how: waitOrRetry}
		}
		degraded = degraded || res.Degraded
		taken = append(taken, sharedTake{rule: r, key: tk.keys[i], n: tk.costs[i], leased: res.Leased})
	}
	return taken, degraded, nil
}

// giveBackShares returns to their shares the units taken in memory.
func giveBackShares(taken []sharedTake) {
	for _, s := range taken {
		if s.leased {
			gate.GiveBackLeased(s.rule.limiter, s.key, s.n)
		}
	}
}
