// Command outbound-api paces calls to a partner API with httpthrottle's
// Transport: 5 calls a second per host across every process sharing the
// Redis, and when the partner answers 429 with Retry-After, every process
// backs off until then.
//
//	go run ./examples/outbound-api
package main

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/jobthrottle/jobthrottle/examples/internal/embedded"
	"github.com/jobthrottle/jobthrottle/httpthrottle"
	"github.com/jobthrottle/jobthrottle/throttle"
)

func main() {
	rdb, stop := embedded.Redis() // in production: redis.NewClient(&redis.Options{Addr: "redis:6379"})
	defer stop()

	// A fake partner: its fourth call is answered 429, Retry-After: 1.
	var calls atomic.Int32
	start := time.Now()
	partner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		fmt.Printf("%5.2fs  partner got call %d\n", time.Since(start).Seconds(), n)
		if n == 4 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	defer partner.Close()

	// 5 calls a second per host; a throttled GET is retried once, after the
	// block its Retry-After set.
	limiter, err := throttle.New(rdb, "partner-api", throttle.GCRA{Rate: throttle.PerSecond(5), Burst: 1})
	if err != nil {
		log.Fatal(err)
	}
	transport, err := httpthrottle.NewTransport(limiter, httpthrottle.WithRetries(1))
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: transport, Timeout: 30 * time.Second}

	for i := 1; i <= 6; i++ {
		resp, err := client.Get(partner.URL)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Printf("%5.2fs  request %d: %s\n", time.Since(start).Seconds(), i, resp.Status)
	}
	// The calls are 200 ms apart; after the 429 nothing is sent for a
	// second, then the request is retried and the rest resume the pace.
}
