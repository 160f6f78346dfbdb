package throttleotel_test

import (
	"context"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/throttleotel"
	"github.com/jobthrottle/jobthrottle/worker"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// BenchmarkObserveDecision measures what the instrumentation adds to one
// decision, on the SDK's providers (metrics aggregated by a reader; spans
// recorded and then dropped, as a batch exporter's queue would take them):
// with no span in the context (metrics only), and with a recording span
// (metrics and a span event). A decision itself is a Redis round trip of
// 80-115 µs on these machines (docs/benchmarks.md).
//
//	cd throttleotel && go test -run '^$' -bench ObserveDecision -benchmem
func BenchmarkObserveDecision(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer tp.Shutdown(context.Background())
	defer mp.Shutdown(context.Background())
	inst, err := throttleotel.New(throttleotel.WithTracerProvider(tp), throttleotel.WithMeterProvider(mp))
	if err != nil {
		b.Fatal(err)
	}
	d := throttle.Decision{Limiter: "partner-api", Op: throttle.OpAllow, Key: "tenant-42", N: 1, Policy: "gcra:10/1s:5",
		PolicySource: throttle.SourceCode, Outcome: throttle.Throttled, RetryAfter: 80 * time.Millisecond, Latency: 95 * time.Microsecond}
	e := worker.Event{Kind: worker.Rescheduled, TaskID: "b7c1", TaskType: "partner:sync", Rule: "tenant", Limiter: "partner-api", Key: "tenant-42", Delay: time.Second}
	tracer := tp.Tracer("bench")
	for _, tc := range []struct {
		name    string
		observe func(context.Context)
	}{
		{"decision", func(ctx context.Context) { inst.ObserveDecision(ctx, d) }},
		{"task", func(ctx context.Context) { inst.Observe(ctx, e) }},
	} {
		b.Run(tc.name+"/no-span", func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				tc.observe(ctx)
			}
		})
		b.Run(tc.name+"/recording-span", func(b *testing.B) {
			b.ReportAllocs()
			// A span per 16 decisions, as a job that makes a few would
			// have: the SDK caps a span's events (128 by default).
			ctx, span := tracer.Start(context.Background(), "job")
			i := 0
			for b.Loop() {
				if i++; i%16 == 0 {
					span.End()
					ctx, span = tracer.Start(context.Background(), "job")
				}
				tc.observe(ctx)
			}
			span.End()
		})
	}
}
