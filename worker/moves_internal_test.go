package worker

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// scriptCalls counts a client's script calls.
type scriptCalls struct{ n atomic.Int64 }

func (c *scriptCalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *scriptCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if strings.HasPrefix(cmd.Name(), "eval") {
			c.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (c *scriptCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestCalledBackTasksMoveTogether: the parked tasks of one queue that a
// cap's release calls back together are moved to the head of their queue
// in one script call, the first called nearest the head (taken first),
// ahead of the tasks already waiting there.
func TestCalledBackTasksMoveTogether(t *testing.T) {
	tg := redistest.New(t)
	client := tg.NewClient(t)
	calls := &scriptCalls{}
	client.AddHook(calls)
	ctx := context.Background()
	capLimiter, err := throttle.NewConcurrencyLimiter(client, "exports", throttle.Concurrency{Limit: 1, Lease: 10 * time.Second}, throttle.WithPrefix(tg.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	th, err := New(client, []Rule{Concurrency("exports", Type("export"), capLimiter, KeyBy(ByType()))}, WithPrefix(tg.Prefix), WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = th.Close(context.Background()) })

	queue := "q-moves-" + tg.Prefix[len(tg.Prefix)-9:len(tg.Prefix)-1]
	t.Cleanup(func() {
		for _, key := range []string{asynqRetryKey(queue), asynqScheduledKey(queue), asynqPendingKey(queue)} {
			_ = tg.Client.Del(context.Background(), key).Err()
		}
	})
	enqueuer := asynq.NewClientFromRedisClient(client)
	var ids []string
	for i := range 4 {
		opts := []asynq.Option{asynq.Queue(queue)}
		if i > 0 {
			opts = append(opts, asynq.ProcessIn(time.Hour)) // held back, as a parked task is
		}
		info, err := enqueuer.EnqueueContext(ctx, asynq.NewTask("export", nil), opts...)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, info.ID)
		t.Cleanup(func() { _ = tg.Client.Del(context.Background(), asynqTaskKey(queue, info.ID)).Err() })
	}
	// The script loaded first (go-redis's first EVALSHA of it sends EVAL).
	if _, err := th.move(ctx, queue, "none"); err != nil {
		t.Fatal(err)
	}
	before := calls.n.Load()
	th.callBack([]string{queue + "\x1f" + ids[2], queue + "\x1f" + ids[3], queue + "\x1f" + ids[1]})
	deadline := time.Now().Add(5 * time.Second)
	var pending []string
	for {
		pending, err = tg.Client.LRange(ctx, asynqPendingKey(queue), 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(pending) == 4 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Workers take from the right: the head is the end of the list.
	want := []string{ids[0], ids[1], ids[3], ids[2]}
	if strings.Join(pending, ",") != strings.Join(want, ",") {
		t.Fatalf("pending, tail to head: %q; want %q", pending, want)
	}
	if n := calls.n.Load() - before; n != 1 {
		t.Errorf("%d script calls moved the called tasks; want 1", n)
	}
}
