package throttleotel_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/httpthrottle"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/throttleotel"
	"github.com/jobthrottle/jobthrottle/worker"
	"github.com/redis/go-redis/v9"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// embedded starts an embedded Redis for an example; stop it with the
// returned function.
func embedded() (*redis.Client, func(), error) {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		return nil, nil, err
	}
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	return rdb, func() { rdb.Close(); m.Close() }, nil
}

// printEvents prints the events of the ended spans, one per line.
func printEvents(spans *tracetest.SpanRecorder) {
	for _, s := range spans.Ended() {
		for _, e := range s.Events() {
			outcome := ""
			for _, kv := range e.Attributes {
				switch kv.Key {
				case "jobthrottle.outcome", "jobthrottle.http.event":
					outcome = kv.Value.AsString()
				}
			}
			fmt.Println(s.Name(), e.Name, outcome)
		}
	}
}

// A limiter reports its decisions to the span of the caller's context. In
// a program, the providers are the ones the program set up (for example an
// OTLP exporter's): throttleotel.New() with no options takes the global
// ones.
func Example() {
	rdb, stop, err := embedded()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))

	inst, err := throttleotel.New(throttleotel.WithTracerProvider(tp))
	if err != nil {
		fmt.Println(err)
		return
	}
	partner, err := throttle.New(rdb, "partner-api", throttle.GCRA{Rate: throttle.PerMinute(1), Burst: 1}, throttle.WithObserver(inst))
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, span := tp.Tracer("example").Start(context.Background(), "sync-orders")
	for range 2 {
		_, _ = partner.Allow(ctx, "tenant-42")
	}
	span.End()
	printEvents(spans)
	// Output:
	// sync-orders throttle.decision admitted
	// sync-orders throttle.decision throttled
}

// A Throttler reports what it did with each task to the span of the
// task's handler: put the tracing middleware outside the Throttler's.
func ExampleInstrumentation_Observe() {
	rdb, stop, err := embedded()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()
	inst, err := throttleotel.New()
	if err != nil {
		fmt.Println(err)
		return
	}
	limiter, err := throttle.New(rdb, "partner-api", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1}, throttle.WithObserver(inst))
	if err != nil {
		fmt.Println(err)
		return
	}
	th, err := worker.New(rdb, []worker.Rule{
		worker.Rate("partner", worker.Pattern("partner:*"), limiter, worker.KeyBy(worker.Constant("all"))),
	}, worker.WithObserver(inst))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer th.Close(context.Background())
	cfg := asynq.Config{Concurrency: 10}
	th.Configure(&cfg)
	srv := asynq.NewServerFromRedisClient(rdb, cfg)
	mux := asynq.NewServeMux()
	mux.Use(th.Middleware) // after the tracing middleware, if any
	_ = srv                // srv.Run(mux) serves the tasks
	fmt.Println("wired")
	// Output: wired
}

// A Transport adds its waits and an upstream's back-offs to the span of
// each request.
func ExampleInstrumentation_TransportOption() {
	rdb, stop, err := embedded()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	inst, err := throttleotel.New(throttleotel.WithTracerProvider(tp))
	if err != nil {
		fmt.Println(err)
		return
	}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer upstream.Close()

	limiter, err := throttle.New(rdb, "partner-api", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	transport, err := httpthrottle.NewTransport(limiter, inst.TransportOption())
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, span := tp.Tracer("example").Start(context.Background(), "GET partner")
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, upstream.URL, nil)
	if resp, err := (&http.Client{Transport: transport}).Do(req); err == nil {
		resp.Body.Close()
	}
	span.End()
	printEvents(spans)
	// Output:
	// GET partner throttle.turn
}

// A Middleware adds its answer to the span of each inbound request.
func ExampleInstrumentation_MiddlewareOption() {
	rdb, stop, err := embedded()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	inst, err := throttleotel.New(throttleotel.WithTracerProvider(tp))
	if err != nil {
		fmt.Println(err)
		return
	}
	limiter, err := throttle.New(rdb, "inbound", throttle.SlidingLog{Limit: 1, Window: time.Minute})
	if err != nil {
		fmt.Println(err)
		return
	}
	limit, err := httpthrottle.NewMiddleware(limiter, inst.MiddlewareOption())
	if err != nil {
		fmt.Println(err)
		return
	}
	h := limit.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for range 2 {
		ctx, span := tp.Tracer("example").Start(context.Background(), "GET /orders")
		req := httptest.NewRequestWithContext(ctx, http.MethodGet, "/orders", nil)
		h.ServeHTTP(httptest.NewRecorder(), req)
		span.End()
	}
	printEvents(spans)
	// Output:
	// GET /orders throttle.request admitted
	// GET /orders throttle.request rejected
}
