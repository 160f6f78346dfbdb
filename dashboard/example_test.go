package dashboard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/alicebob/miniredis/v2"
	"github.com/jobthrottle/jobthrottle/dashboard"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// A process publishes its limiter's counts for the fleet's dashboard, and
// the dashboard is mounted under /ops/throttle/ of a server. Here its data
// are read as the page's script reads them.
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

	pub, err := dashboard.NewPublisher(rdb)
	if err != nil {
		fmt.Println(err)
		return
	}
	partner, err := throttle.New(rdb, "partner-api", throttle.GCRA{Rate: throttle.PerMinute(1), Burst: 1}, throttle.WithObserver(pub))
	if err != nil {
		fmt.Println(err)
		return
	}
	for range 3 {
		if _, err := partner.Allow(ctx, "tenant-42"); err != nil {
			fmt.Println(err)
			return
		}
	}
	if err := pub.Close(ctx); err != nil { // writes what is left
		fmt.Println(err)
		return
	}

	h, err := dashboard.New(rdb)
	if err != nil {
		fmt.Println(err)
		return
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/throttle/", http.StripPrefix("/ops/throttle", h))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	resp, err := http.Get(srv.URL + "/ops/throttle/api/overview")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	var overview struct {
		Limiters []struct {
			Name, Policy, Source string
			Keys                 int
			HeldBack             int64
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&overview); err != nil {
		fmt.Println(err)
		return
	}
	for _, l := range overview.Limiters {
		fmt.Printf("%s: %s from %s, %d key, %d held back\n", l.Name, l.Policy, l.Source, l.Keys, l.HeldBack)
	}
	// Output:
	// partner-api: gcra:1/1m:1 from code, 1 key, 2 held back
}
