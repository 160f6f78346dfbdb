// Command http-api limits an HTTP API per client with httpthrottle's
// middleware: 3 requests per 10 seconds per client IP, shared by every
// instance of the API on the same Redis, with the RateLimit and
// X-RateLimit headers on every response and 429 with Retry-After beyond.
//
//	go run ./examples/http-api
package main

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/jobthrottle/jobthrottle/examples/internal/embedded"
	"github.com/jobthrottle/jobthrottle/httpthrottle"
	"github.com/jobthrottle/jobthrottle/throttle"
)

func main() {
	rdb, stop := embedded.Redis() // in production: redis.NewClient(&redis.Options{Addr: "redis:6379"})
	defer stop()

	// 3 requests in any 10 seconds per client.
	limiter, err := throttle.New(rdb, "api-per-client", throttle.SlidingLog{Limit: 3, Window: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	limit, err := httpthrottle.NewMiddleware(limiter)
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/orders", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"orders":[]}`)
	})
	api := httptest.NewServer(limit.Handler(mux)) // clients arrive from 127.0.0.1
	defer api.Close()

	for i := 1; i <= 4; i++ {
		resp, err := http.Get(api.URL + "/orders")
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Printf("request %d: %s  RateLimit: %s  X-RateLimit-Remaining: %s  Retry-After: %q\n",
			i, resp.Status, resp.Header.Get("RateLimit"), resp.Header.Get("X-RateLimit-Remaining"), resp.Header.Get("Retry-After"))
	}
	fmt.Println("RateLimit-Policy:", advertisedPolicy(api.URL))
}

// advertisedPolicy reads the policy the API advertises.
func advertisedPolicy(url string) string {
	resp, err := http.Get(url + "/orders")
	if err != nil {
		return err.Error()
	}
	resp.Body.Close()
	return resp.Header.Get("RateLimit-Policy")
}
