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
