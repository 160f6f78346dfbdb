package workermetrics_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/metrics"
	"github.com/jobthrottle/jobthrottle/metrics/workermetrics"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
)

// One Collector, registered once, counts the decisions of a concurrency
// limiter (through throttle.WithObserver) and the events of the asynq
// Throttler that uses it (through workermetrics.Observer).
func Example() {
	m := miniredis.NewMiniRedis() // an embedded Redis, for the example
	if err := m.Start(); err != nil {
		fmt.Println(err)
		return
	}
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	c, err := metrics.New()
	if err != nil {
		fmt.Println(err)
		return
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)

	exports, err := throttle.NewConcurrencyLimiter(rdb, "exports", throttle.Concurrency{Limit: 2, Lease: 30 * time.Second}, throttle.WithObserver(c))
	if err != nil {
		fmt.Println(err)
		return
	}
	th, err := worker.New(rdb, []worker.Rule{worker.Concurrency("exports", worker.Type("export:run"), exports, worker.KeyBy(worker.Constant("exports")))},
		worker.WithObserver(workermetrics.Observer(c)))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer th.Close(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	srv := th.NewServer(asynq.Config{Concurrency: 1, LogLevel: asynq.FatalLevel})
	err = srv.Start(th.Middleware(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		wg.Done()
		return nil
	})))
	if err != nil {
		fmt.Println(err)
		return
	}
	client := asynq.NewClientFromRedisClient(rdb)
	for range 2 {
		if _, err := client.Enqueue(asynq.NewTask("export:run", nil)); err != nil {
			fmt.Println(err)
			return
		}
	}
	wg.Wait()
	srv.Shutdown() // waits for the handlers, and so for their leases' release

	web := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer web.Close()
	resp, err := http.Get(web.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	scanner := bufio.NewScanner(resp.Body)
	for scanner.Scan() {
		line := scanner.Text()
		if strings.HasPrefix(line, "jobthrottle_decisions_total{") || strings.HasPrefix(line, "jobthrottle_worker_tasks_total{") ||
			strings.HasPrefix(line, "jobthrottle_worker_leases_held{") {
			fmt.Println(line)
		}
	}
	// Output:
	// jobthrottle_decisions_total{limiter="exports",op="acquire",outcome="admitted"} 2
	// jobthrottle_worker_leases_held{rule="exports"} 0
	// jobthrottle_worker_tasks_total{event="admitted",rule="",task_type="export:run"} 2
}
