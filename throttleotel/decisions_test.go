package throttleotel_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/throttleotel"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

func newLimiter(t testing.TB, tg *redistest.Target, name string, p throttle.Policy, opts ...throttle.Option) *throttle.Limiter {
	t.Helper()
	l, err := throttle.New(tg.Client, name, p, append([]throttle.Option{throttle.WithPrefix(tg.Prefix)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestDecisionsInTheCallersSpanAndMetrics makes a known sequence of real
// decisions (embedded Redis, or REDIS_ADDR / REDIS_CLUSTER_ADDRS) under a
// span, and checks the span's events, the child span of a Wait's sleep,
// and every metric point.
func TestDecisionsInTheCallersSpanAndMetrics(t *testing.T) {
	tg := redistest.New(t)
	tm := newTelemetry(t)
	partner := newLimiter(t, tg, "partner", throttle.GCRA{Rate: throttle.PerHour(1), Burst: 2}, throttle.WithObserver(tm.inst))
	paced := newLimiter(t, tg, "paced", throttle.GCRA{Rate: throttle.PerSecond(20), Burst: 1}, throttle.WithObserver(tm.inst))

	ctx, root := tm.tracer.Start(context.Background(), "job")
	for range 3 {
		_, _ = partner.Allow(ctx, "tenant-1") // admitted, admitted, throttled
	}
	_, _ = partner.Peek(ctx, "tenant-1")
	if _, err := partner.Allow(ctx, ""); !errors.Is(err, throttle.ErrInvalidKey) {
		t.Fatalf("empty key: %v", err)
	}
	var called, returned time.Time // the second Wait's
	for range 2 {
		called = time.Now()
		if err := paced.Wait(ctx, "tenant-1"); err != nil { // the second sleeps up to 50 ms
			t.Fatal(err)
		}
		returned = time.Now()
	}
	root.End()

	jobs := tm.ended("job")
	if len(jobs) != 1 {
		t.Fatalf("%d spans named job", len(jobs))
	}
	job := jobs[0]
	const gcra = "jobthrottle.policy.source=code jobthrottle.policy=gcra:1/1h:2"
	const pacedPolicy = "jobthrottle.policy.source=code jobthrottle.policy=gcra:20/1s:1"
	want := []string{
		"jobthrottle.limiter.name=partner jobthrottle.operation=allow jobthrottle.outcome=admitted " + gcra + " jobthrottle.units=1",
		"jobthrottle.limiter.name=partner jobthrottle.operation=allow jobthrottle.outcome=admitted " + gcra + " jobthrottle.units=1",
		"jobthrottle.limiter.name=partner jobthrottle.operation=allow jobthrottle.outcome=throttled " + gcra + " jobthrottle.retry_after=* jobthrottle.units=1",
		"jobthrottle.limiter.name=partner jobthrottle.operation=peek jobthrottle.outcome=throttled " + gcra + " jobthrottle.retry_after=* jobthrottle.units=1",
		"error.type=invalid_request jobthrottle.limiter.name=partner jobthrottle.operation=allow jobthrottle.outcome=error jobthrottle.units=1",
		"jobthrottle.limiter.name=paced jobthrottle.operation=reserve jobthrottle.outcome=admitted " + pacedPolicy + " jobthrottle.units=1",
		"jobthrottle.limiter.name=paced jobthrottle.operation=reserve jobthrottle.outcome=admitted " + pacedPolicy + " jobthrottle.units=1",
	}
	evs := events(job, "throttle.decision")
	if len(evs) != len(job.Events()) {
		t.Errorf("job span has events other than throttle.decision: %v", job.Events())
	}
	if len(evs) != len(want) {
		t.Fatalf("%d decision events, want %d: %v", len(evs), len(want), evs)
	}
	for i, e := range evs {
		got := strings.Join(attrs(e.Attributes), " ")
		if v, ok := attr(e.Attributes, "jobthrottle.retry_after"); ok {
			if v.AsFloat64() < 59*60 || v.AsFloat64() > 3600 { // GCRA 1/h, burst 2: the next unit in about an hour
				t.Errorf("event %d: retry_after %v s, want about an hour", i, v.AsFloat64())
			}
			got = strings.Replace(got, "jobthrottle.retry_after="+v.String(), "jobthrottle.retry_after=*", 1)
		}
		if got != want[i] {
			t.Errorf("event %d:\n got %s\nwant %s", i, got, want[i])
		}
	}

	waits := tm.ended("throttle.wait")
	if len(waits) != 1 {
		t.Fatalf("%d throttle.wait spans, want the second Wait's", len(waits))
	}
	w := waits[0]
	if w.Parent().SpanID() != job.SpanContext().SpanID() || w.SpanKind() != trace.SpanKindInternal {
		t.Errorf("throttle.wait's parent %s kind %s, want the job span %s, internal", w.Parent().SpanID(), w.SpanKind(), job.SpanContext().SpanID())
	}
	if got := strings.Join(attrs(w.Attributes()), " "); got != "jobthrottle.limiter.name=paced jobthrottle.units=1" {
		t.Errorf("throttle.wait attributes %s", got)
	}
	// GCRA 20/s spaces the two Waits 50 ms apart on the Redis clock: the
	// second sleeps for what is left of that after the first returned. The
	// span covers that sleep: it lies within the call.
	if w.StartTime().Before(called) || w.EndTime().After(returned) || !w.EndTime().After(w.StartTime()) {
		t.Errorf("throttle.wait [%s, %s] is not a sleep within the second Wait [%s, %s]", w.StartTime(), w.EndTime(), called, returned)
	}
	got := tm.metrics(t)
	for k := range got {
		if strings.Contains(k, "_sum{") {
			delete(got, k) // latencies: whatever the machine makes of them
		}
	}
	checkPoints(t, got, map[string]float64{
		"jobthrottle.decisions{jobthrottle.limiter.name=partner,jobthrottle.operation=allow,jobthrottle.outcome=admitted,jobthrottle.policy.source=code}":  2,
		"jobthrottle.decisions{jobthrottle.limiter.name=partner,jobthrottle.operation=allow,jobthrottle.outcome=throttled,jobthrottle.policy.source=code}": 1,
		"jobthrottle.decisions{jobthrottle.limiter.name=partner,jobthrottle.operation=peek,jobthrottle.outcome=throttled,jobthrottle.policy.source=code}":  1,
		"jobthrottle.decisions{jobthrottle.limiter.name=partner,jobthrottle.operation=allow,jobthrottle.outcome=error,jobthrottle.policy.source=}":         1,
		"jobthrottle.decisions{jobthrottle.limiter.name=paced,jobthrottle.operation=reserve,jobthrottle.outcome=admitted,jobthrottle.policy.source=code}":  2,
		"jobthrottle.policy.decisions{jobthrottle.limiter.name=partner,jobthrottle.policy=gcra:1/1h:2}":                                                    4,
		"jobthrottle.policy.decisions{jobthrottle.limiter.name=paced,jobthrottle.policy=gcra:20/1s:1}":                                                     2,
		"jobthrottle.decision.duration_count{jobthrottle.limiter.name=partner,jobthrottle.operation=allow}":                                                4,
		"jobthrottle.decision.duration_count{jobthrottle.limiter.name=partner,jobthrottle.operation=peek}":                                                 1,
		"jobthrottle.decision.duration_count{jobthrottle.limiter.name=paced,jobthrottle.operation=reserve}":                                                2,
		"jobthrottle.wait.duration_count{jobthrottle.limiter.name=paced,jobthrottle.outcome=admitted}":                                                     1,
	})
}

// TestKeysOnSpansOnlyWhenAskedFor: caller keys stay off spans by default,
// and go on hashed or raw when asked; metrics never carry them.
func TestKeysOnSpansOnlyWhenAskedFor(t *testing.T) {
	tg := redistest.New(t)
	sum := sha256.Sum256([]byte("tenant-7"))
	for _, tc := range []struct {
		mode      throttleotel.KeyMode
		key, want string
	}{
		{throttleotel.KeysOmitted, "", ""},
		{throttleotel.KeysHashed, "jobthrottle.key.hash", hex.EncodeToString(sum[:8])},
		{throttleotel.KeysRaw, "jobthrottle.key", "tenant-7"},
	} {
		tm := newTelemetry(t, throttleotel.WithKeys(tc.mode))
		l := newLimiter(t, tg, "keys", throttle.GCRA{Rate: throttle.PerSecond(100), Burst: 10}, throttle.WithObserver(tm.inst))
		ctx, span := tm.tracer.Start(context.Background(), "job")
		_, _ = l.Allow(ctx, "tenant-7")
		span.End()
		e := events(tm.ended("job")[0], "throttle.decision")[0]
		for _, k := range []string{"jobthrottle.key", "jobthrottle.key.hash"} {
			v, ok := attr(e.Attributes, k)
			if k == tc.key && (!ok || v.AsString() != tc.want) {
				t.Errorf("mode %d: %s = %q (present %v), want %q", tc.mode, k, v.AsString(), ok, tc.want)
			}
			if k != tc.key && ok {
				t.Errorf("mode %d: %s = %q, want none", tc.mode, k, v.AsString())
			}
		}
		for k := range tm.metrics(t) {
			if strings.Contains(k, "tenant-7") || strings.Contains(k, tc.want+",") && tc.want != "" {
				t.Errorf("mode %d: a metric carries the key: %s", tc.mode, k)
			}
		}
	}
	if _, err := throttleotel.New(throttleotel.WithKeys(throttleotel.KeyMode(7))); !errors.Is(err, throttleotel.ErrInvalidOption) {
		t.Errorf("unknown key mode: %v", err)
	}
	for _, opt := range []throttleotel.Option{nil, throttleotel.WithTracerProvider(nil), throttleotel.WithMeterProvider(nil)} {
		if _, err := throttleotel.New(opt); !errors.Is(err, throttleotel.ErrInvalidOption) {
			t.Errorf("bad option: %v, want ErrInvalidOption", err)
		}
	}
}

// TestNoSpanNoTrace: a decision whose context carries no span starts none,
// and is still counted; a Wait cut short by its context ends its span
// with an error.
func TestNoSpanNoTrace(t *testing.T) {
	tg := redistest.New(t)
	tm := newTelemetry(t)
	l := newLimiter(t, tg, "quiet", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1}, throttle.WithObserver(tm.inst))
	for range 2 {
		if err := l.Wait(context.Background(), "k"); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(tm.spans.Ended()) + len(tm.spans.Started()); n != 0 {
		t.Fatalf("%d spans without a span in the context", n)
	}
	if got := tm.metrics(t)["jobthrottle.decisions{jobthrottle.limiter.name=quiet,jobthrottle.operation=reserve,jobthrottle.outcome=admitted,jobthrottle.policy.source=code}"]; got != 2 {
		t.Fatalf("%v decisions counted, want 2", got)
	}

	// A limit of one an hour: the Wait's slot is far off; its context
	// ends it after 50 ms, and its span says so.
	slow := newLimiter(t, tg, "slow", throttle.SlidingLog{Limit: 1, Window: time.Hour}, throttle.WithObserver(tm.inst))
	_ = slow.Wait(context.Background(), "k")
	ctx, span := tm.tracer.Start(context.Background(), "job")
	cancelled, cancel := context.WithCancel(ctx)
	time.AfterFunc(50*time.Millisecond, cancel)
	if err := slow.Wait(cancelled, "k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait: %v, want it cancelled", err)
	}
	span.End()
	waits := tm.ended("throttle.wait")
	if len(waits) != 1 || waits[0].Status().Code != codes.Error {
		t.Fatalf("wait spans %v, want one ended in error", waits)
	}
	if v, _ := attr(waits[0].Attributes(), "error.type"); v.AsString() != "canceled" {
		t.Errorf("error.type %q, want canceled", v.AsString())
	}
}

// TestFailuresAndDenyCacheCounted: decisions Redis could not make count in
// jobthrottle.redis.errors (failed closed: outcome error; let through:
// outcome degraded), and refusals the deny cache answered in
// jobthrottle.deny_cache.hits; the caller's span says which.
func TestFailuresAndDenyCacheCounted(t *testing.T) {
	tg := redistest.New(t)
	tm := newTelemetry(t)
	dead := redis.NewClient(&redis.Options{Addr: redistest.DeadAddr(t), MaxRetries: -1, DialerRetries: 1})
	defer dead.Close()
	ctx, span := tm.tracer.Start(context.Background(), "job")
	for _, failure := range []throttle.FailurePolicy{throttle.FailClosed, throttle.FailOpen} {
		l, err := throttle.New(dead, "down-"+failure.String(), throttle.GCRA{Rate: throttle.PerSecond(5), Burst: 5},
			throttle.WithFailurePolicy(failure), throttle.WithObserver(tm.inst), throttle.WithLogger(nil))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = l.Allow(ctx, "k")
	}
	cached := newLimiter(t, tg, "cached", throttle.GCRA{Rate: throttle.PerHour(1), Burst: 1}, throttle.WithDenyCache(16), throttle.WithObserver(tm.inst))
	for range 3 {
		_, _ = cached.Allow(ctx, "k") // admitted, throttled by Redis, throttled by the cache
	}
	span.End()

	var outcomes []string
	for _, e := range events(tm.ended("job")[0], "throttle.decision") {
		o, _ := attr(e.Attributes, "jobthrottle.outcome")
		et, _ := attr(e.Attributes, "error.type")
		c, _ := attr(e.Attributes, "jobthrottle.cached")
		outcomes = append(outcomes, o.AsString()+"/"+et.AsString()+"/"+c.String())
	}
	if got, want := strings.Join(outcomes, " "), "error/unavailable/ degraded/unavailable/ admitted// throttled// throttled//true"; got != want {
		t.Errorf("decision events %s, want %s", got, want)
	}
	got := tm.metrics(t)
	for k, v := range map[string]float64{
		"jobthrottle.redis.errors{jobthrottle.limiter.name=down-fail-closed}":                                                                                    1,
		"jobthrottle.redis.errors{jobthrottle.limiter.name=down-fail-open}":                                                                                      1,
		"jobthrottle.deny_cache.hits{jobthrottle.limiter.name=cached}":                                                                                           1,
		"jobthrottle.decisions{jobthrottle.limiter.name=down-fail-open,jobthrottle.operation=allow,jobthrottle.outcome=degraded,jobthrottle.policy.source=code}": 1,
	} {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if _, ok := got["jobthrottle.redis.errors{jobthrottle.limiter.name=cached}"]; ok {
		t.Errorf("redis.errors counted for a limiter whose Redis answered")
	}
}
