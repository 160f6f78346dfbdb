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
// of its assembled file) on a client, and adds up the second value of their
// replies where the first is 1 (lane_poll.lua's tasks moved by a holder).
type scriptCalls struct {
	sha   string
	n     atomic.Int64
	moved atomic.Int64
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
	ours := false
	switch strings.ToLower(cmd.Name()) {
	case "evalsha":
		s, _ := args[1].(string)
		ours = s == c.sha
	case "eval":
		if s, _ := args[1].(string); s != "" {
			sum := sha1.Sum([]byte(s))
			ours = hex.EncodeToString(sum[:]) == c.sha
		}
	}
	if !ours {
		return
	}
	c.n.Add(1)
	if r, ok := cmd.(*redis.Cmd); ok {
		if v, err := r.Slice(); err == nil && len(v) > 1 && v[0] == int64(1) {
			moved, _ := v[1].(int64)
			c.moved.Add(moved)
		}
	}
}

func (c *scriptCalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *scriptCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		c.count(cmd)
		return err
	}
}
func (c *scriptCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			c.count(cmd)
		}
		return err
	}
}

// laneFleet is processes asynq servers of workers each, a Throttler of
// its own apiece (opts), under one rule of 50/s, burst 1, on tg; polls and
// moves count lane_poll.lua's turns and lane.lua's single moves.
type laneFleet struct {
	tg           *redistest.Target
	f            *asynqtest.Fleet
	seen         asynqtest.Events
	log          asynqtest.RunLog
	polls, moves *scriptCalls
	cluster      bool
}

func newLaneFleet(t *testing.T, processes, workers int, opts ...worker.Option) *laneFleet {
	t.Helper()
	lf := &laneFleet{tg: redistest.New(t)}
	tg := lf.tg
	_, lf.cluster = tg.Client.(*redis.ClusterClient)
	lf.polls = countScript(t, tg.Client, "lane_poll.lua")
	lf.moves = countScript(t, tg.Client, "lane.lua")
	limiter, err := throttle.New(tg.Client, "l", throttle.GCRA{Rate: throttle.PerSecond(50), Burst: 1}, throttle.WithPrefix(tg.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	rules := []worker.Rule{worker.Rate("report", worker.AnyTask(), limiter, worker.KeyBy(worker.ByType()))}
	for i := range processes {
		th := asynqtest.NewThrottler(t, tg, rules, append([]worker.Option{worker.WithObserver(&lf.seen)}, opts...)...)
		t.Cleanup(func() { _ = th.Close(context.Background()) })
		if i == 0 {
			lf.f = asynqtest.NewFleet(t, tg, 1, workers, th, lf.log.Handler(0))
		} else {
			lf.f.AddServer(t, workers, th, lf.log.Handler(0))
		}
	}
	return lf
}

// run enqueues tasks tasks and waits until they ran; it fails the test when
// one ran other than once, was archived or failed, or when a 1 s window on
// the Redis clock admitted more than the rate allows, and when fewer than
// least went back to asynq (the lane then goes untested). It returns how
// many went back.
func (lf *laneFleet) run(t *testing.T, tasks, least int) int {
	t.Helper()
	var ids []string
	for i := range tasks {
		ids = append(ids, lf.f.Enqueue(t, "report", map[string]int{"n": i}))
	}
	info := lf.f.WaitDone(t, &lf.log, tasks, 60*time.Second)
	runs := lf.log.Snapshot()
	asynqtest.CheckOnce(t, runs, ids)
	if info.Archived != 0 || info.Failed != 0 {
		t.Errorf("queue after the run: %d archived, %d failed; want 0 and 0", info.Archived, info.Failed)
	}
	asynqtest.CheckHeld(t, runs, lf.seen.Slots(), redistest.ClockOffset(t, lf.tg.Client), time.Second, 51)
	back := lf.seen.Count(worker.Rescheduled)
	t.Logf("figures: %d tasks, %d went back; the lane's turns %d moved %d; single moves %d",
		tasks, back, lf.polls.n.Load(), lf.polls.moved.Load(), lf.moves.n.Load())
	if back < least {
		t.Fatalf("only %d of %d tasks went back: the test does not exercise the lane", back, tasks)
	}
	return back
}

// TestLaneMovesTheFleetsTasksInBatches: three processes (a Throttler and an
// asynq server each, 30 workers) share a backlog of 150 tasks under one
// rule of 50/s, with no inline wait beyond the least (twice the lane's
// lead, 400 ms), so most tasks book a slot further off and go back to
// asynq, however slowly the servers start. On one Redis server each such
// task joins its queue's lane in Redis in the call that booked it, and the
// lane's one holder moves the due tasks in batches: the lane's turns number
// fewer than half the tasks that went back (a move per task, as before,
// would be one each) and move at least 90% of them, no task is moved on its
// own, every task runs once, none is archived, and no 1 s window on the
// Redis clock admits more than the rate allows. On a Cluster the lane is
// not in Redis (the meter's key and the queue are in different slots):
// each process moves its own tasks, one call each, as before.
func TestLaneMovesTheFleetsTasksInBatches(t *testing.T) {
	lf := newLaneFleet(t, 3, 30, worker.WithInlineWait(0))
	const tasks = 150
	back := int64(lf.run(t, tasks, tasks/2))
	polls, moved, moves := lf.polls.n.Load(), lf.polls.moved.Load(), lf.moves.n.Load()
	if lf.cluster {
		if polls != 0 || moves < back {
			t.Errorf("on a Cluster: the lane's turns %d, single moves %d; want 0 and one a task that went back (%d)", polls, moves, back)
		}
		return
	}
	if moves != 0 || polls == 0 || polls > back/2 || moved < back*9/10 {
		t.Errorf("the lane's turns %d moved %d, single moves %d, for %d tasks that went back; want no single move, fewer turns than half the tasks and 90%% of them moved by the lane",
			polls, moved, moves, back)
	}
}

// TestLaneIsTakenOverFromAHolderThatStopped: the queue's lane is held by a
// process that has stopped without giving it up (its lease, 1.5 s, still
// runs when the tasks come). The processes that put tasks in the lane look
// at it when that lease ends, one takes it over, and moves the lane's tasks
// from then on: at least 90% of the tasks that went back are moved by the
// lane (the rest come back by asynq's own retry, 2 s after their turn, as
// they would with no process left), every task runs once, none is
// archived, no 1 s window on the Redis clock admits more than the rate
// allows, and no task is moved on its own. miniredis expires no key on its
// own (its clock is driven), so there the test ends the lease itself.
func TestLaneIsTakenOverFromAHolderThatStopped(t *testing.T) {
	lf := newLaneFleet(t, 2, 40)
	if lf.cluster {
		t.Log("on a Cluster the lane is not in Redis (TestLaneMovesTheFleetsTasksInBatches checks what happens instead)")
	} else {
		holder := lf.tg.Prefix + "worker:lane:{" + lf.f.Queue + "}:holder"
		if err := lf.tg.Client.Set(context.Background(), holder, "a-process-that-stopped", 1500*time.Millisecond).Err(); err != nil {
			t.Fatal(err)
		}
		if lf.tg.Mini != nil {
			time.AfterFunc(1500*time.Millisecond, func() { lf.tg.Mini.Del(holder) })
		}
	}
	const tasks = 150
	back := int64(lf.run(t, tasks, tasks/4))
	if moved, moves := lf.polls.moved.Load(), lf.moves.n.Load(); !lf.cluster && (moved < back*9/10 || moves != 0) {
		t.Errorf("the lane moved %d of %d tasks that went back, single moves %d; want the lane taken over (90%% moved by it) and no single move", moved, back, moves)
	}
}
