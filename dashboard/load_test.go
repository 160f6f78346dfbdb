package dashboard_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jobthrottle/jobthrottle/dashboard"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// manyKeys is the size of the fleet TestPageLoadWithManyKeys reads.
const manyKeys = 10000

// TestPageLoadWithManyKeys fills a limiter with 10,000 keys, each decided
// and counted by a Publisher, and loads a limiter's page as the browser
// does: the HTML, the script, the limiter, a page of its keys (sorted by
// what they held back, then searched by prefix) and its chart. It checks
// what the page is given and reports how long each request took (figures:
// lines); the time is not asserted.
func TestPageLoadWithManyKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("fills Redis with 10,000 keys")
	}
	tgt := redistest.New(t)
	ctx := context.Background()
	pub, err := dashboard.NewPublisher(tgt.Client, dashboard.WithPublishPrefix(tgt.Prefix), dashboard.WithKeysPerLimiter(manyKeys))
	if err != nil {
		t.Fatal(err)
	}
	l, err := throttle.New(tgt.Client, "bulk", throttle.GCRA{Rate: throttle.PerMinute(1), Burst: 1},
		throttle.WithPrefix(tgt.Prefix), throttle.WithObserver(pub))
	if err != nil {
		t.Fatal(err)
	}
	// Every key is decided once by the limiter, in Redis; key i's i%3
	// rejections after that are told to the Publisher as the limiter would
	// tell them (the script runs of a rejection are no different, and the
	// race detector makes 10,000 more of them slow to run beside the other
	// packages' tests).
	var batch []throttle.Request
	wantThrottled := 0
	for i := range manyKeys {
		key := fmt.Sprintf("tenant-%05d", i)
		batch = append(batch, throttle.Request{Key: key, N: 1})
		for range i % 3 {
			wantThrottled++
			pub.ObserveDecision(context.Background(), throttle.Decision{Limiter: "bulk", Op: throttle.OpAllow, Key: key, N: 1,
				Policy: l.Policy().String(), PolicySource: throttle.SourceCode, Outcome: throttle.Throttled})
		}
		if len(batch) >= 1000 || i == manyKeys-1 {
			if _, err := l.AllowMany(ctx, batch); err != nil {
				t.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	h, err := dashboard.New(tgt.Client, dashboard.WithPrefix(tgt.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	s := &site{tgt: tgt, limiter: l, srv: srv}
	var total time.Duration
	fetch := func(path string, v any) {
		t.Helper()
		start := time.Now()
		if v != nil {
			s.getJSON(t, path, v)
		} else {
			resp, err := http.Get(srv.URL + path)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		took := time.Since(start)
		total += took
		t.Logf("figures: %s with %d keys: %s", path, manyKeys, took.Round(time.Millisecond))
	}
	fetch("/limiter?"+q("name", "bulk"), nil)
	fetch("/assets/app.js", nil)
	var lim struct {
		Limiter struct{ Keys int }
		Hottest []struct {
			Key      string
			HeldBack int64
		}
	}
	fetch("/api/limiter?"+q("name", "bulk"), &lim)
	if lim.Limiter.Keys != manyKeys || len(lim.Hottest) != 10 || lim.Hottest[0].HeldBack != 2 {
		t.Fatalf("limiter: %d keys, hottest %+v; want %d keys and 10 hottest holding back 2 each", lim.Limiter.Keys, lim.Hottest, manyKeys)
	}
	var keys struct {
		Rows []struct {
			Key      string
			HeldBack int64
		}
		Total, Pages int
	}
	fetch("/api/keys?"+q("name", "bulk"), &keys)
	if keys.Total != manyKeys || keys.Pages != manyKeys/dashboard.DefaultPageSize || len(keys.Rows) != dashboard.DefaultPageSize ||
		keys.Rows[0].Key != "tenant-00002" || keys.Rows[0].HeldBack != 2 {
		t.Fatalf("keys: total %d in %d pages, first %+v", keys.Total, keys.Pages, keys.Rows[:min(1, len(keys.Rows))])
	}
	var series struct{ Points [][4]int64 }
	fetch("/api/series?"+q("name", "bulk"), &series)
	var admitted, throttled int64
	for _, p := range series.Points {
		admitted, throttled = admitted+p[1], throttled+p[2]
	}
	if admitted != manyKeys || throttled != int64(wantThrottled) {
		t.Fatalf("series: %d admitted, %d throttled; want %d and %d", admitted, throttled, manyKeys, wantThrottled)
	}
	t.Logf("figures: the limiter's page with %d keys loads in %s (HTML, script, limiter, first page of keys, chart)", manyKeys, total.Round(time.Millisecond))
	if chromium := findChromium(); chromium != "" {
		// The same page in a browser: from navigation to the first page of
		// keys shown, its chart drawn.
		b := startBrowser(t, chromium)
		start := time.Now()
		b.run(t, "load the limiter's page", chromedp.Navigate(srv.URL+"/limiter?"+q("name", "bulk")))
		waitFor(t, b, "50 keys shown", `document.querySelectorAll("#keys tbody tr").length`, func(n int) bool { return n == dashboard.DefaultPageSize })
		waitFor(t, b, "the chart drawn", `(document.querySelector("polyline.throttled").getAttribute("points") || "").length`, func(n int) bool { return n > 0 })
		t.Logf("figures: the limiter's page with %d keys, in Chromium: keys and chart shown %s after navigating", manyKeys, time.Since(start).Round(time.Millisecond))
	}
	fetch("/api/keys?"+q("name", "bulk", "prefix", "tenant-0999", "sort", "key", "page", "2"), &keys)
	if keys.Total != 10 || len(keys.Rows) != 10 || keys.Rows[0].Key != "tenant-09990" {
		t.Fatalf("search: total %d, %d rows on page 2 of 1 (the last page is shown)", keys.Total, len(keys.Rows))
	}
}
