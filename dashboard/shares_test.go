package dashboard_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jobthrottle/jobthrottle/dashboard"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// leasingFleet starts two processes' limiters (each on a client of its
// own) of one name with leased shares, GCRA 100/s burst 10, each asking
// key "acme" 50 times a second until the test ends.
func leasingFleet(t *testing.T, tg *redistest.Target) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for range 2 {
		l, err := throttle.New(tg.NewClient(t), "partner-api", throttle.GCRA{Rate: throttle.PerSecond(100), Burst: 10},
			throttle.WithPrefix(tg.Prefix), throttle.WithLeasedShares(0))
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { _ = l.Close(context.Background()) }()
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
					_, _ = l.Allow(ctx, "acme")
				}
			}
		}()
	}
}

// keyView is what api/key says of a key with leased shares.
type keyView struct {
	Limiter struct {
		Leased bool `json:"leased"`
	} `json:"limiter"`
	State struct {
		Known  bool   `json:"known"`
		Policy string `json:"policy"`
	} `json:"state"`
	Shares struct {
		Leased            bool    `json:"leased"`
		RestRatePerSecond float64 `json:"restRatePerSecond"`
		Holders           []struct {
			Holder         string  `json:"holder"`
			RatePerSecond  float64 `json:"ratePerSecond"`
			Burst          float64 `json:"burst"`
			LeaseEndsInMs  int64   `json:"leaseEndsInMs"`
			AskedPerSecond float64 `json:"askedPerSecond"`
		} `json:"holders"`
	} `json:"shares"`
}

// TestKeyShowsLeasedShares: while two processes hold shares of a key's
// rate (throttle.WithLeasedShares), the dashboard lists the key among the
// limiter's keys (their state lives in the shares' key), marks the limiter
// as leasing, and the key's data gives each process's share (rate, burst,
// when its lease ends, what it asked for) and the rest; the shares and the
// rest add up to at most the policy's rate.
func TestKeyShowsLeasedShares(t *testing.T) {
	tg := redistest.New(t)
	leasingFleet(t, tg)
	h, err := dashboard.New(tg.Client, dashboard.WithPrefix(tg.Prefix), dashboard.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	s := &site{tgt: tg, srv: httptestServer(t, http.StripPrefix("/ops", h))}
	var v keyView
	path := "/ops/api/key?" + q("name", "partner-api", "key", "acme")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		// The limiter is known once its processes have registered its name
		// (a moment after their first decision).
		v = keyView{}
		status, body := s.get(t, path)
		if status == http.StatusOK {
			if err := json.Unmarshal([]byte(body), &v); err != nil {
				t.Fatal(err)
			}
			if len(v.Shares.Holders) == 2 && v.Shares.Holders[0].RatePerSecond > 0 && v.Shares.Holders[1].RatePerSecond > 0 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s, the key's data: %d %s; want two processes holding shares", status, body)
		}
	}
	if !v.Limiter.Leased || !v.Shares.Leased || !v.State.Known || v.State.Policy != "gcra:100/1s:10" {
		t.Errorf("the key's data: %+v; want the limiter leasing, its state known under gcra:100/1s:10", v)
	}
	sum := v.Shares.RestRatePerSecond
	for _, hd := range v.Shares.Holders {
		sum += hd.RatePerSecond
		if hd.Holder == "" || hd.Burst <= 0 || hd.LeaseEndsInMs <= 0 || hd.LeaseEndsInMs > 1500 || hd.AskedPerSecond <= 0 {
			t.Errorf("a share: %+v; want its process, a burst, a lease ending within 1.5 s, its demand", hd)
		}
	}
	if sum > 100+1e-6 {
		t.Errorf("the shares and the rest add up to %.2f/s; the policy allows 100/s", sum)
	}
	// The dashboard scans for keys every 2 s at most: the key is listed
	// by the next scan.
	var keys struct {
		Rows []struct {
			Key string `json:"key"`
		} `json:"rows"`
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		s.getJSON(t, "/ops/api/keys?"+q("name", "partner-api", "sort", "key"), &keys)
		if len(keys.Rows) == 1 && keys.Rows[0].Key == "acme" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the limiter's keys: %+v; want acme", keys.Rows)
		}
	}
	t.Logf("figures: the key's shares: %+v", v.Shares)
}

// TestKeyPageShowsLeasedSharesInBrowser: in headless Chromium, the key's
// page lists the two processes' shares and says what the rest is.
func TestKeyPageShowsLeasedSharesInBrowser(t *testing.T) {
	chromium := findChromium()
	if chromium == "" {
		t.Skip("no Chromium on this machine: install Debian's chromium package (.ci/run does)")
	}
	tg := redistest.New(t)
	leasingFleet(t, tg)
	b, _ := openDashboard(t, chromium, tg, keyPage("partner-api", "acme"))
	rows := waitFor(t, b, "two shares in #shares",
		`[...document.querySelectorAll("#shares tbody tr")].map(tr => [...tr.children].map(td => td.textContent).join("|"))`,
		func(rows []string) bool { return len(rows) == 2 })
	t.Logf("figures: the shares in the browser: %q", rows)
	for _, r := range rows {
		if cells := strings.Split(r, "|"); len(cells) != 5 || !strings.HasSuffix(cells[1], "/s") || cells[3] == "–" {
			t.Errorf("row %q: want process, rate, burst, lease ends in, asked", r)
		}
	}
	var note, ahead string
	b.run(t, "read #shares-note", chromedp.Text("#shares-note", &note, chromedp.ByQuery))
	b.run(t, "read #ahead", chromedp.Text("#ahead", &ahead, chromedp.ByQuery))
	if !strings.Contains(note, "2 processes hold shares") || !strings.Contains(note, "Redis decides the rest") {
		t.Errorf("#shares-note says %q", note)
	}
	if !strings.Contains(ahead, "leased shares books nothing") {
		t.Errorf("#ahead says %q", ahead)
	}
	b.check(t) // no dialog, no exception
}
