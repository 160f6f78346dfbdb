package worker

import (
	"context"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/bounded"
	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/jobthrottle/jobthrottle/internal/scripts"
)

var throttledTaskScript = scripts.Load(scriptFiles, "lua/assembled/throttled_task.lua")

// minCountRetention is the least time a task's throttle counts are kept
// after its latest throttle.
const minCountRetention = 24 * time.Hour

// countThrottle records one more throttle of the task by rule and returns
// the count and the time since the first.
func (t *Throttler) countThrottle(ctx context.Context, rule *Rule, origin string) (int, time.Duration, error) {
	keep := max(rule.giveUp.MaxThrottledTime, minCountRetention)
	key := t.cfg.prefix + "worker:task:" + keyspace.Tag(origin)
	var reply []int64
	err := bounded.Call(ctx, func(ctx context.Context) error {
		var err error
		reply, err = throttledTaskScript.Run(ctx, t.client, []string{key}, rule.name, keep.Microseconds()).Int64Slice()
		return err
	})
	if err != nil {
		return 0, 0, t.redisError(err)
	}
	return int(reply[0]), time.Duration(reply[1]) * time.Microsecond, nil
}

// givesUp reports whether rule's policy gives up after these counts.
func (p GiveUpPolicy) givesUp(throttles int, since time.Duration) bool {
	return (p.MaxThrottles > 0 && throttles > p.MaxThrottles) ||
		(p.MaxThrottledTime > 0 && since >= p.MaxThrottledTime)
}
