package worker_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
)

// TestRulesByQueue: one asynq server takes tasks of one type from two
// queues; a rule matches the bulk queue only (worker.Queue) and keys by
// queue (worker.ByQueue), at 5/s. Every task runs once; on the Redis
// clock no second holds more than 6 bulk admissions (5/s, burst 1); every
// wait and reschedule is the bulk queue's, under its queue's name as key;
// the critical queue's tasks, which no rule matches, all ran before half
// of the bulk ones had.
func TestRulesByQueue(t *testing.T) {
	tg := redistest.New(t)
	limiter := asynqtest.NewLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(5), Burst: 1})
	var seen asynqtest.Events
	th := asynqtest.NewThrottler(t, tg, []worker.Rule{
		worker.Rate("bulk", worker.Queue("bulk-"+tg.Prefix), limiter, worker.KeyBy(worker.ByQueue())),
	}, worker.WithObserver(&seen))
	bulk, critical := "bulk-"+tg.Prefix, "critical-"+tg.Prefix
	inspector := asynq.NewInspectorFromRedisClient(tg.NewClient(t))
	t.Cleanup(func() {
		_ = inspector.DeleteQueue(bulk, true)
		_ = inspector.DeleteQueue(critical, true)
	})
	var mu sync.Mutex
	byQueue := map[string][]asynqtest.Run{}
	handler := asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		mu.Lock()
		byQueue[worker.QueueOf(ctx)] = append(byQueue[worker.QueueOf(ctx)], asynqtest.Run{ID: worker.OriginalTaskID(ctx, task), TaskID: id, At: time.Now()})
		mu.Unlock()
		return nil
	})
	cfg := asynq.Config{Concurrency: 10, Queues: map[string]int{bulk: 1, critical: 1}, LogLevel: asynq.FatalLevel, ShutdownTimeout: 3 * time.Second}
	th.Configure(&cfg)
	srv := asynq.NewServerFromRedisClient(tg.NewClient(t), cfg)
	t.Cleanup(srv.Shutdown)
	if err := srv.Start(th.Middleware(handler)); err != nil {
		t.Fatal(err)
	}
	client := asynq.NewClientFromRedisClient(tg.NewClient(t))
	for range 20 {
		for _, q := range []string{bulk, critical} {
			if _, err := client.Enqueue(asynq.NewTask("report", nil), asynq.Queue(q)); err != nil {
				t.Fatal(err)
			}
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		done := len(byQueue[bulk]) == 20 && len(byQueue[critical]) == 20
		mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s: %d bulk and %d critical runs of 20 each", len(byQueue[bulk]), len(byQueue[critical]))
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	asynqtest.CheckHeld(t, byQueue[bulk], seen.Slots(), redistest.ClockOffset(t, tg.Client), time.Second, 6)
	for _, e := range seen.All() {
		if (e.Kind == worker.Rescheduled || e.Kind == worker.WaitedInline) && e.Key != bulk {
			t.Errorf("a wait under key %q, want the bulk queue's name: %+v", e.Key, e)
		}
	}
	lastCritical := byQueue[critical][len(byQueue[critical])-1].At
	if tenth := byQueue[bulk][9].At; !lastCritical.Before(tenth) {
		t.Errorf("the critical queue's last task ran at %s, after the bulk queue's tenth (%s): held by the bulk rule", lastCritical.Format(time.StampMilli), tenth.Format(time.StampMilli))
	}
}
