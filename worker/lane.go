package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/bounded"
	"github.com/jobthrottle/jobthrottle/internal/scripts"
)

var laneScript = scripts.Load(scriptFiles, "lua/assembled/lane.lua")

// The return lane (see lane.lua): a task sent back is moved to the head of
// its queue at its turn by the Throttler's dispatcher, and by asynq itself,
// laneFallback later, if no dispatcher runs.
const laneFallback = 2 * time.Second

// Keys of asynq v0.26 (internal/base), in the queue's Cluster slot.
func asynqRetryKey(queue string) string     { return "asynq:{" + queue + "}:retry" }
func asynqScheduledKey(queue string) string { return "asynq:{" + queue + "}:scheduled" }
func asynqPendingKey(queue string) string   { return "asynq:{" + queue + "}:pending" }
func asynqTaskKey(queue, id string) string  { return "asynq:{" + queue + "}:t:" + id }

// asynqQueueKeys returns queue's retry, scheduled and pending keys, the
// first keys of lane.lua and lane_poll.lua.
func asynqQueueKeys(queue string) []string {
	return []string{asynqRetryKey(queue), asynqScheduledKey(queue), asynqPendingKey(queue)}
}

// laneKeys returns the keys of lane.lua for tasks ids of queue.
func laneKeys(queue string, ids []string) []string {
	keys := asynqQueueKeys(queue)
	for _, id := range ids {
		keys = append(keys, asynqTaskKey(queue, id))
	}
	return keys
}

// Lane moves.
const (
	laneGone   = 0
	laneMoved  = 1
	laneNotYet = 2
)

// move moves tasks ids of queue to the head of their queue in one call,
// ids[0] nearest the head (taken first), and returns what became of each
// (laneMoved, laneNotYet, laneGone).
func (t *Throttler) move(ctx context.Context, queue string, ids ...string) ([]int, error) {
	var results []int
	err := bounded.Call(ctx, func(ctx context.Context) error {
		args := make([]any, 0, 1+len(ids))
		args = append(args, time.Now().UnixNano())
		for _, id := range ids {
			args = append(args, id)
		}
		reply, err := laneScript.Run(ctx, t.client, laneKeys(queue, ids), args...).Int64Slice()
		if err != nil {
			return err
		}
		if len(reply) != 1+len(ids) {
			return fmt.Errorf("lane.lua returned %d values for %d tasks", len(reply), len(ids))
		}
		results = make([]int, len(ids))
		for i := range ids {
			results[i] = int(reply[1+i])
		}
		return nil
	})
	if err != nil {
		return nil, t.redisError(err)
	}
	return results, nil
}
