package worker_test

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
	"github.com/redis/go-redis/v9"
)

// refuseCopies fails the first n commands that enqueue a hand-over copy (a
// task ID with "~") as a Redis that refuses connections would.
type refuseCopies struct{ left atomic.Int64 }

func (h *refuseCopies) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *refuseCopies) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if strings.HasPrefix(cmd.Name(), "eval") && enqueuesACopy(cmd.Args()) && h.left.Add(-1) >= 0 {
			err := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// enqueuesACopy reports a script run on a hand-over copy's task key
// (asynq:{queue}:t:<ID>~n).
func enqueuesACopy(args []any) bool {
	for _, a := range args {
		if s, ok := a.(string); ok && strings.Contains(s, ":t:") && strings.Contains(s, "~") {
			return true
		}
	}
	return false
}

func (h *refuseCopies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestAHandOverWaitsForRedis: a task with no retries left is handed over
// to a copy while Redis does not answer (the copy's first three enqueues
// fail as on a connection refused): the hand-over waits and tries again,
// and every task runs once; before, the first failure archived the task.
func TestAHandOverWaitsForRedis(t *testing.T) {
	tg := redistest.New(t)
	refuse := &refuseCopies{}
	refuse.left.Store(3)
	tg.Client.AddHook(refuse)
	limiter := asynqtest.NewLimiter(t, tg, throttle.GCRA{Rate: throttle.Rate{N: 1, Per: 3 * time.Second}, Burst: 1})
	th := asynqtest.NewThrottler(t, tg, []worker.Rule{worker.Rate("slow", worker.AnyTask(), limiter, worker.KeyBy(worker.ByType()))}, worker.WithLogger(nil))
	var log asynqtest.RunLog
	f := asynqtest.NewFleet(t, tg, 1, 5, th, log.Handler(0))
	var ids []string
	for i := range 2 {
		// 2 s per attempt: the second task's turn (3 s) is past its deadline.
		ids = append(ids, f.Enqueue(t, "export", map[string]int{"n": i}, asynq.MaxRetry(0), asynq.Timeout(2*time.Second)))
	}
	info := f.WaitDone(t, &log, 2, 30*time.Second)
	asynqtest.CheckOnce(t, log.Snapshot(), ids)
	if info.Archived != 0 || info.Failed != 0 {
		t.Fatalf("%d archived, %d failed; want none", info.Archived, info.Failed)
	}
	if left := refuse.left.Load(); left > 0 {
		t.Fatalf("%d refusals of a copy's enqueue left: the test did not refuse any hand-over", left)
	}
}
