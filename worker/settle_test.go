package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
)

// TestSettleWaitsForRedis: a handler ends while Redis is down, 200 ms after
// it went down. With WithSettle (the default) the middleware returns only
// once Redis answers again, so that asynq can record the outcome; without
// it, at once.
func TestSettleWaitsForRedis(t *testing.T) {
	for _, settle := range []bool{true, false} {
		srv := redistest.StartServer(t, redistest.ServerOptions{})
		tg := srv.Target(t)
		limiter, err := throttle.New(tg.NewClient(t), "limiter", throttle.GCRA{Rate: throttle.PerSecond(100), Burst: 10},
			throttle.WithPrefix(tg.Prefix), throttle.WithLogger(nil))
		if err != nil {
			t.Fatal(err)
		}
		th := asynqtest.NewThrottler(t, tg, []worker.Rule{worker.Rate("r", worker.Type("t"), limiter, worker.KeyBy(worker.ByType()))},
			worker.WithLogger(nil), worker.WithSettle(settle))
		returned := make(chan error, 1)
		stopped := make(chan struct{})
		go func() {
			returned <- th.Middleware(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
				srv.Stop(t) // Redis dies while the task runs
				close(stopped)
				// Longer than the 100 ms after an answer (its decision)
				// in which settle trusts Redis.
				time.Sleep(200 * time.Millisecond)
				return nil
			})).ProcessTask(context.Background(), asynq.NewTask("t", nil))
		}()
		<-stopped // the server is the test's again: Start below may touch it
		select {
		case err := <-returned:
			if settle {
				t.Fatalf("the middleware returned (%v) while Redis was down", err)
			}
			srv.Start(t)
			continue
		case <-time.After(500 * time.Millisecond):
			if !settle {
				t.Fatal("without WithSettle the middleware still waits 500ms after the handler ended")
			}
		}
		srv.Start(t)
		select {
		case err := <-returned:
			if err != nil {
				t.Fatalf("after Redis came back: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the middleware still waits 10s after Redis came back")
		}
	}
}

// TestSettleTrustsAsynqsOwnAnswers: asynq polls its queues through the
// Throttler's client while workers are free (every 50-150 ms with
// Configure's 100 ms). Those answers say Redis is up as well as a PING
// would, so a task ending 300 ms after its decision (whose answer is too
// old) mostly needs no PING of its own. The rule decides on another
// client, so its answers do not count; each task ends alone, so tasks
// share no PING. Before settle counted asynq's answers, every task sent one.
func TestSettleTrustsAsynqsOwnAnswers(t *testing.T) {
	const tasks = 10
	tg := redistest.New(t)
	client := tg.NewClient(t)
	pings := &roundTrips{only: "ping"}
	client.AddHook(pings)
	limiter := asynqtest.NewLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(1000), Burst: 100})
	th, err := worker.New(client, []worker.Rule{worker.Rate("r", worker.Type("t"), limiter, worker.KeyBy(worker.ByType()))},
		worker.WithPrefix(tg.Prefix), worker.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	queue := "q-settle-" + tg.Prefix[len(tg.Prefix)-9:len(tg.Prefix)-1]
	srv := th.NewServer(asynq.Config{Concurrency: 10, Queues: map[string]int{queue: 1}, LogLevel: asynq.FatalLevel, ShutdownTimeout: 3 * time.Second})
	t.Cleanup(srv.Shutdown)
	ended := make(chan struct{}, tasks)
	if err := srv.Start(th.Middleware(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		time.Sleep(300 * time.Millisecond)
		ended <- struct{}{}
		return nil
	}))); err != nil {
		t.Fatal(err)
	}
	enqueuer := asynq.NewClientFromRedisClient(tg.NewClient(t))
	inspector := asynq.NewInspectorFromRedisClient(tg.NewClient(t))
	t.Cleanup(func() { _ = inspector.DeleteQueue(queue, true) })
	before := pings.n.Load()
	for range tasks {
		if _, err := enqueuer.Enqueue(asynq.NewTask("t", nil), asynq.Queue(queue)); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ended:
		case <-time.After(10 * time.Second):
			t.Fatal("a task did not end within 10s")
		}
	}
	got := pings.n.Load() - before
	t.Logf("figures: %s: %d PINGs for %d tasks ending 300 ms after their decisions", tg.Kind, got, tasks)
	if got > tasks/2 {
		t.Errorf("%d PINGs for %d tasks: asynq's own answers on the client did not count", got, tasks)
	}
}
