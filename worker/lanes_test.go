package worker_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
	"github.com/redis/go-redis/v9"
)

// scriptCalls counts the calls of one of the worker's scripts (by the SHA1
// of its assembled file) on a client.
type scriptCalls struct {
	sha string
	n   atomic.Int64
}

func countScript(t *testing.T, client redis.UniversalClient, file string) *scriptCalls {
	t.Helper()
	body, err := os.ReadFile("lua/assembled/" + file)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha1.Sum(body)
	c := &scriptCalls{sha: hex.EncodeToString(sum[:])}
	client.AddHook(c)
	return c
}

func (c *scriptCalls) count(cmd redis.Cmder) {
	args := cmd.Args()
	if len(args) < 2 {
		return
	}
	switch strings.ToLower(cmd.Name()) {
	case "evalsha":
		if s, _ := args[1].(string); s == c.sha {
			c.n.Add(1)
		}
	case "eval":
		if s, _ := args[1].(string); s != "" {
			if sum := sha1.Sum([]byte(s)); hex.EncodeToString(sum[:]) == c.sha {
				c.n.Add(1)
			}
		}
	}
}

func (c *scriptCalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *scriptCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.count(cmd)
		return next(ctx, cmd)
	}
}
func (c *scriptCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.count(cmd)
		}
		return next(ctx, cmds)
	}
}

// TestLaneMovesTheFleetsTasksInBatches: three processes (a Throttler and an
// asynq server each, 30 workers) share a backlog of 150 tasks under one
// rule of 50/s, so most tasks book a slot more than the inline wait away and go
// back to asynq. On one Redis server each such task joins its queue's lane
// in Redis in the call that booked it, and the lane's one holder moves the
// due tasks in batches: the lane's turns number fewer than half the tasks
// that went back (a move per task, as before, would be one each), no task
// is moved on its own, every task runs once, none is archived, and no 1 s
// window on the Redis clock admits more than the rate allows. On a Cluster
// the lane is not in Redis (the meter's key and the queue are in different
// slots): each process moves its own tasks, one call each, as before.
func TestLaneMovesTheFleetsTasksInBatches(t *testing.T) {
	tg := redistest.New(t)
	_, cluster := tg.Client.(*redis.ClusterClient)
	polls := countScript(t, tg.Client, "lane_poll.lua")
	moves := countScript(t, tg.Client, "lane.lua")
	limiter, err := throttle.New(tg.Client, "l", throttle.GCRA{Rate: throttle.PerSecond(50), Burst: 1}, throttle.WithPrefix(tg.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	var seen asynqtest.Events
	rules := []worker.Rule{worker.Rate("report", worker.AnyTask(), limiter, worker.KeyBy(worker.ByType()))}
	var log asynqtest.RunLog
	var f *asynqtest.Fleet
	for i := range 3 {
		th := asynqtest.NewThrottler(t, tg, rules, worker.WithObserver(&seen))
		t.Cleanup(func() { _ = th.Close(context.Background()) })
		if i == 0 {
			f = asynqtest.NewFleet(t, tg, 1, 30, th, log.Handler(0))
		} else {
			f.AddServer(t, 30, th, log.Handler(0))
		}
	}
	const tasks = 150
	var ids []string
	for i := range tasks {
		ids = append(ids, f.Enqueue(t, "report", map[string]int{"n": i}))
	}
	info := f.WaitDone(t, &log, tasks, 60*time.Second)
	runs := log.Snapshot()
	asynqtest.CheckOnce(t, runs, ids)
	if info.Archived != 0 || info.Failed != 0 {
		t.Errorf("queue after the run: %d archived, %d failed; want 0 and 0", info.Archived, info.Failed)
	}
	asynqtest.CheckHeld(t, runs, seen.Slots(), redistest.ClockOffset(t, tg.Client), time.Second, 51)
	back := seen.Count(worker.Rescheduled)
	t.Logf("figures: %d tasks, %d went back; the lane's turns %d, single moves %d", tasks, back, polls.n.Load(), moves.n.Load())
	if back < tasks/2 {
		t.Fatalf("only %d of %d tasks went back: the test does not exercise the lane", back, tasks)
	}
	if cluster {
		if polls.n.Load() != 0 || moves.n.Load() < int64(back) {
			t.Errorf("on a Cluster: the lane's turns %d, single moves %d; want 0 and one a task that went back (%d)", polls.n.Load(), moves.n.Load(), back)
		}
		return
	}
	if moves.n.Load() != 0 || polls.n.Load() == 0 || polls.n.Load() > int64(back)/2 {
		t.Errorf("the lane's turns %d, single moves %d, for %d tasks that went back; want no single move and fewer turns than half the tasks", polls.n.Load(), moves.n.Load(), back)
	}
}
