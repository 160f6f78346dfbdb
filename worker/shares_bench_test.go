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

// BenchmarkMiddlewareUnderALimitThatNeverBinds: what the middleware costs
// a task in its process under one rule keyed by a payload field, whose
// GCRA never binds, with leased shares (decided in memory) and with a
// round trip each; handlers that return at once, called directly. It
// reports the library's commands to Redis per task.
func BenchmarkMiddlewareUnderALimitThatNeverBinds(b *testing.B) {
	for _, c := range []struct {
		name string
		opts []throttle.Option
	}{
		{"leased", []throttle.Option{throttle.WithLeasedShares(0)}},
		{"round trip", nil},
	} {
		b.Run(c.name, func(b *testing.B) {
			tg := redistest.New(b)
			ctx := context.Background()
			trips := &roundTrips{}
			client := tg.NewClient(b)
			client.AddHook(trips)
			l, err := throttle.New(client, "far-above", throttle.GCRA{Rate: throttle.PerSecond(10_000_000), Burst: 1000},
				append([]throttle.Option{throttle.WithPrefix(tg.Prefix)}, c.opts...)...)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = l.Close(ctx) })
			th, err := worker.New(client, []worker.Rule{worker.Rate("tenant", worker.Type("sync"), l, worker.KeyBy(worker.ByPayloadField("tenant")))},
				worker.WithPrefix(tg.Prefix), worker.WithSettle(false))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = th.Close(ctx) })
			h := th.Middleware(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil }))
			task := asynq.NewTask("sync", []byte(`{"tenant":"t1"}`))
			// Long enough for a share to be granted.
			for deadline := time.Now().Add(300 * time.Millisecond); time.Now().Before(deadline); time.Sleep(100 * time.Microsecond) {
				if err := h.ProcessTask(ctx, task); err != nil {
					b.Fatal(err)
				}
			}
			before := trips.n.Load()
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if err := h.ProcessTask(ctx, task); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(trips.n.Load()-before)/float64(b.N), "redis-calls/op")
		})
	}
}
