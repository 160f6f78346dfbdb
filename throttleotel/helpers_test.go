package throttleotel_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/jobthrottle/jobthrottle/throttleotel"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// telemetry is an Instrumentation on the SDK's in-memory span recorder
// and a manual metric reader.
type telemetry struct {
	inst   *throttleotel.Instrumentation
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
	tracer trace.Tracer
}

func newTelemetry(t testing.TB, opts ...throttleotel.Option) *telemetry {
	t.Helper()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	inst, err := throttleotel.New(append([]throttleotel.Option{throttleotel.WithTracerProvider(tp), throttleotel.WithMeterProvider(mp)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return &telemetry{inst: inst, spans: spans, reader: reader, tracer: tp.Tracer("test")}
}

// ended returns the ended spans named name.
func (tm *telemetry) ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range tm.spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// metrics returns every data point collected now, as
// "name{k=v,...}" -> value (a histogram's count, under name_count, and its
// sum, under name_sum).
func (tm *telemetry) metrics(t testing.TB) map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := tm.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != throttleotel.ScopeName {
			t.Errorf("metrics under scope %q, want %q", sm.Scope.Name, throttleotel.ScopeName)
		}
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range data.DataPoints {
					out[m.Name+setString(p.Attributes)] = float64(p.Value)
				}
			case metricdata.Histogram[float64]:
				for _, p := range data.DataPoints {
					out[m.Name+"_count"+setString(p.Attributes)] = float64(p.Count)
					out[m.Name+"_sum"+setString(p.Attributes)] = p.Sum
				}
			default:
				t.Fatalf("metric %s of unexpected type %T", m.Name, m.Data)
			}
		}
	}
	return out
}

// checkPoints fails the test unless got holds exactly want.
func checkPoints(t testing.TB, got, want map[string]float64) {
	t.Helper()
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
	for k, v := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected point %s = %v", k, v)
		}
	}
}

func setString(s attribute.Set) string {
	var parts []string
	for _, kv := range s.ToSlice() {
		parts = append(parts, fmt.Sprintf("%s=%s", kv.Key, kv.Value.String()))
	}
	sort.Strings(parts)
	return "{" + strings.Join(parts, ",") + "}"
}

// attrs returns kvs as "k=v" strings, sorted.
func attrs(kvs []attribute.KeyValue) []string {
	var out []string
	for _, kv := range kvs {
		out = append(out, fmt.Sprintf("%s=%s", kv.Key, kv.Value.String()))
	}
	slices.Sort(out)
	return out
}

// attr returns the value of key in kvs, and whether it is there.
func attr(kvs []attribute.KeyValue, key string) (attribute.Value, bool) {
	for _, kv := range kvs {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// events returns the events of span named name.
func events(span sdktrace.ReadOnlySpan, name string) []sdktrace.Event {
	var out []sdktrace.Event
	for _, e := range span.Events() {
		if e.Name == name {
			out = append(out, e)
		}
	}
	return out
}
