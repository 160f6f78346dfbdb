package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
)

func BenchmarkZZLeasedMiddleware(b *testing.B) {
	tg := redistest.New(b)
	ctx := context.Background()
	l, err := throttle.New(tg.Client, "leased", throttle.GCRA{Rate: throttle.PerSecond(10_000_000), Burst: 1000}, throttle.WithPrefix(tg.Prefix), throttle.WithLeasedShares(0))
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close(ctx)
	th, err := worker.New(tg.Client, []worker.Rule{worker.Rate("tenant", worker.Type("fleet:task"), l, worker.KeyBy(worker.ByPayloadField("tenant")))}, worker.WithPrefix(tg.Prefix))
	if err != nil {
		b.Fatal(err)
	}
	h := th.Middleware(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil }))
	task := asynq.NewTask("fleet:task", []byte(`{"tenant":"t1"}`))
	for range 2000 {
		_ = h.ProcessTask(ctx, task)
		time.Sleep(100 * time.Microsecond)
	}
	b.ResetTimer()
	b.ReportAllocs()
	for b.Loop() {
		if err := h.ProcessTask(ctx, task); err != nil {
			b.Fatal(err)
		}
	}
}
