package httpthrottle_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jobthrottle/jobthrottle/httpthrottle"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// Pace calls to a partner API to 5 per second across every process that
// shares the Redis, and back off together when it answers 429.
func ExampleNewTransport() {
	m := miniredis.NewMiniRedis() // an embedded Redis, for the example
	if err := m.Start(); err != nil {
		fmt.Println(err)
		return
	}
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})

	partner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	defer partner.Close()

	limiter, err := throttle.New(rdb, "partner-api", throttle.GCRA{Rate: throttle.PerSecond(5), Burst: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	transport, err := httpthrottle.NewTransport(limiter, httpthrottle.WithRetries(1))
	if err != nil {
		fmt.Println(err)
		return
	}
	client := &http.Client{Transport: transport}
	start := time.Now()
	for range 3 {
		resp, err := client.Get(partner.URL)
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
	}
	fmt.Println("3 calls at 5/s took at least 400ms:", time.Since(start) >= 400*time.Millisecond)
	// Output:
	// 3 calls at 5/s took at least 400ms: true
}

// Limit each client of an HTTP API to 2 requests per minute.
func ExampleNewMiddleware() {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		fmt.Println(err)
		return
	}
	defer m.Close()
	m.SetTime(time.Date(2026, 1, 1, 12, 0, 30, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})

	limiter, _ := throttle.New(rdb, "api-per-client", throttle.FixedWindow{Limit: 2, Window: time.Minute})
	limit, _ := httpthrottle.NewMiddleware(limiter)
	api := limit.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "orders")
	}))

	for range 3 {
		req := httptest.NewRequest(http.MethodGet, "/orders", nil)
		req.RemoteAddr = "203.0.113.7:51000"
		rec := httptest.NewRecorder()
		api.ServeHTTP(rec, req)
		fmt.Printf("%d %s retry-after=%q\n", rec.Code, rec.Header().Get("RateLimit"), rec.Header().Get("Retry-After"))
	}
	// Output:
	// 200 "default";r=1;t=30 retry-after=""
	// 200 "default";r=0;t=30 retry-after=""
	// 429 "default";r=0;t=30 retry-after="30"
}

// A partner whose batch endpoint counts each item against its quota.
func ExampleWithRequestCost() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	limiter, err := throttle.New(rdb, "partner-quota", throttle.Quota{Limit: 10_000, Period: throttle.Day})
	if err != nil {
		fmt.Println(err)
		return
	}
	items := func(req *http.Request) (int, error) {
		n, err := strconv.Atoi(req.Header.Get("X-Batch-Size"))
		if err != nil {
			return 1, nil // not a batch: one unit
		}
		return max(1, n), nil
	}
	transport, err := httpthrottle.NewTransport(limiter, httpthrottle.WithRequestCost(items))
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = &http.Client{Transport: transport}
}
