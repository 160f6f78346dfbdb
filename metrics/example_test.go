package metrics_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/jobthrottle/jobthrottle/metrics"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
)

// One Collector counts the decisions of a limiter, and a registry serves
// them on /metrics. For an asynq Throttler's series, see package
// workermetrics.
func Example() {
	m := miniredis.NewMiniRedis() // an embedded Redis, for the example
	if err := m.Start(); err != nil {
		fmt.Println(err)
		return
	}
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	c, err := metrics.New()
	if err != nil {
		fmt.Println(err)
		return
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)

	// A limiter reports to the Collector through throttle.WithObserver.
	partner, err := throttle.New(rdb, "partner-api", throttle.GCRA{Rate: throttle.PerMinute(1), Burst: 2}, throttle.WithObserver(c))
	if err != nil {
		fmt.Println(err)
		return
	}
	for range 3 {
		_, _ = partner.Allow(ctx, "tenant-42") // admitted, admitted, throttled
	}

	// Serve the registry as Prometheus scrapes it.
	web := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer web.Close()
	printSeries(web.URL, "jobthrottle_decisions_total", "jobthrottle_redis_errors_total")
	// Output:
	// jobthrottle_decisions_total{limiter="partner-api",op="allow",outcome="admitted"} 2
	// jobthrottle_decisions_total{limiter="partner-api",op="allow",outcome="throttled"} 1
	// jobthrottle_redis_errors_total{limiter="partner-api"} 0
}

// printSeries scrapes url and prints the samples of the named series.
func printSeries(url string, names ...string) {
	resp, err := http.Get(url)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	var lines []string
	scanner := bufio.NewScanner(resp.Body)
	for scanner.Scan() {
		lines = append(lines, scanner.Text())
	}
	for _, name := range names {
		for _, line := range lines {
			if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
				fmt.Println(line)
			}
		}
	}
}

// Options change the namespace and the histograms' buckets; bad values are
// errors, never panics.
func ExampleNew() {
	c, err := metrics.New(
		metrics.WithNamespace("billing"),
		metrics.WithLatencyBuckets(0.0005, 0.001, 0.005, 0.05),
		metrics.WithWaitBuckets(0.1, 1, 10, 60),
	)
	fmt.Println(c != nil, err)

	_, err = metrics.New(metrics.WithWaitBuckets(1, 0.5))
	fmt.Println(err)
	// Output:
	// true <nil>
	// metrics: invalid option: wait buckets: bound 1 (0.5) is not above bound 0 (1)
}
