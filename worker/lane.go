package worker

import (
	"context"
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

// laneKeys returns the keys of lane.lua for a task of queue.
func laneKeys(queue, id string) []string {
	return []string{asynqRetryKey(queue), asynqScheduledKey(queue), asynqPendingKey(queue), asynqTaskKey(queue, id)}
}

// toLane has this process's dispatcher move the task with asynq ID id, of
// queue, to the head of its queue at its turn, due. Nothing is written to
// Redis for it: if this process stops first, asynq's own retry brings the
// task back laneFallback later, at the tail of its queue. (A task whose
// decision joined its queue's lane in Redis goes through joinedLane.)
func (t *Throttler) toLane(queue, id string, due time.Time) {
	t.at(turn{at: due, queue: queue, id: id})
}

// Lane moves.
const (
	laneGone   = 0
	laneMoved  = 1
	laneNotYet = 2
)

// move moves one task of the lane to the head of its queue.
func (t *Throttler) move(ctx context.Context, queue, id string) (int, error) {
	var result int64
	err := bounded.Call(ctx, func(ctx context.Context) error {
		reply, err := laneScript.Run(ctx, t.client, laneKeys(queue, id), id, time.Now().UnixNano()).Int64Slice()
		if err == nil {
			result = reply[0]
		}
		return err
	})
	if err != nil {
		return 0, t.redisError(err)
	}
	return int(result), nil
}
