package metrics_test

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/metrics"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
)

// newCollector returns a Collector with default options, registered on a
// pedantic registry of its own (which checks Describe against Collect).
func newCollector(t testing.TB, opts ...metrics.Option) (*metrics.Collector, *prometheus.Registry) {
	t.Helper()
	c, err := metrics.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	return c, reg
}

// samples gathers reg into a map from series to value: counters and gauges
// as name{label="value",...} (labels sorted by name), histograms as
// name_count{...} and name_sum{...}.
func samples(t testing.TB, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			labels := seriesLabels(m)
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				out[f.GetName()+labels] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[f.GetName()+labels] = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				out[f.GetName()+"_count"+labels] = float64(m.GetHistogram().GetSampleCount())
				out[f.GetName()+"_sum"+labels] = m.GetHistogram().GetSampleSum()
			default:
				t.Fatalf("unexpected metric type %s of %s", f.GetType(), f.GetName())
			}
		}
	}
	return out
}

// seriesLabels formats m's labels as {a="x",b="y"}, sorted by name.
func seriesLabels(m *dto.Metric) string {
	var parts []string
	for _, l := range m.GetLabel() {
		parts = append(parts, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
	}
	slices.Sort(parts)
	return "{" + strings.Join(parts, ",") + "}"
}

// withPrefix returns the entries of s whose series name starts with prefix.
func withPrefix(s map[string]float64, prefix string) map[string]float64 {
	out := map[string]float64{}
	for k, v := range s {
		if strings.HasPrefix(k, prefix) {
			out[k] = v
		}
	}
	return out
}

// checkSamples fails the test unless got holds exactly want.
func checkSamples(t testing.TB, got, want map[string]float64) {
	t.Helper()
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
	for k, v := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected series %s = %v", k, v)
		}
	}
}

// compare fails the test unless the named series of c are exactly
// expected, in the text exposition format.
func compare(t testing.TB, c prometheus.Collector, expected string, names ...string) {
	t.Helper()
	if err := testutil.CollectAndCompare(c, strings.NewReader(expected), names...); err != nil {
		t.Fatal(err)
	}
}

// newNamedLimiter returns the Limiter called name, of p on client under
// the target's prefix.
func newNamedLimiter(t testing.TB, client redis.UniversalClient, tg *redistest.Target, name string, p throttle.Policy, opts ...throttle.Option) *throttle.Limiter {
	t.Helper()
	l, err := throttle.New(client, name, p, append([]throttle.Option{throttle.WithPrefix(tg.Prefix)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// newNamedConcurrency returns the ConcurrencyLimiter called name, of p on
// client under prefix.
func newNamedConcurrency(t testing.TB, client redis.UniversalClient, prefix, name string, p throttle.Concurrency, opts ...throttle.Option) *throttle.ConcurrencyLimiter {
	t.Helper()
	l, err := throttle.NewConcurrencyLimiter(client, name, p, append([]throttle.Option{throttle.WithPrefix(prefix)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// deadClient returns a client of an address where nothing listens, that
// fails each command at once.
func deadClient(t testing.TB) *redis.Client {
	t.Helper()
	client := redis.NewClient(&redis.Options{Addr: redistest.DeadAddr(t), MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { client.Close() })
	return client
}

// parseSamples reads lines of "series value", series written as samples
// writes them.
func parseSamples(t testing.TB, text string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			t.Fatalf("bad sample line %q", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("bad sample line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// isWaitSum reports whether series is a sum of the wait histogram, whose
// value depends on timing.
func isWaitSum(series string) bool {
	return strings.HasPrefix(series, "jobthrottle_worker_wait_seconds_sum")
}
