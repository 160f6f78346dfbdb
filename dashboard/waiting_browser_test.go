package dashboard_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jobthrottle/jobthrottle/dashboard"
	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// TestKeyPageShowsTheWaitingRoomInBrowser: in headless Chromium, while a
// fleet's tasks wait in an overall key's waiting room (5/s shared fairly
// by tenant, one tenant named by an outsider), the key's page lists each
// tenant with its tasks waiting, the place of its first and when its last
// is expected to start, the outsider's name as text.
func TestKeyPageShowsTheWaitingRoomInBrowser(t *testing.T) {
	chromium := findChromium()
	if chromium == "" {
		t.Skip("no Chromium on this machine: install Debian's chromium package (.ci/run does)")
	}
	tg := redistest.New(t)
	_, th := fairOverall(t, tg, 5)
	var log asynqtest.RunLog
	f := asynqtest.NewFleet(t, tg, 1, 5, th, log.Handler(time.Millisecond))
	tenants := []string{"acme", "globex", hostileTenant}
	for _, tenant := range tenants {
		for range 20 {
			f.Enqueue(t, "partner:sync", map[string]string{"tenant": tenant})
		}
	}
	b, _ := openDashboard(t, chromium, tg, keyPage("partner-overall", "all"))
	rows := waitFor(t, b, "three tenants in #waiting",
		`[...document.querySelectorAll("#waiting tbody tr")].map(tr => [...tr.children].map(td => td.textContent).join("|"))`,
		func(rows []string) bool { return len(rows) == 3 })
	t.Logf("figures: the waiting room in the browser: %q", rows)
	for _, tenant := range tenants {
		if !slices.ContainsFunc(rows, func(r string) bool { return strings.HasPrefix(r, tenant+"|") }) {
			t.Errorf("tenant %q not listed as text in #waiting: %q", tenant, rows)
		}
	}
	for _, r := range rows {
		cells := strings.Split(r, "|")
		if len(cells) != 4 || cells[1] == "0" || cells[2] == "" || cells[3] == "" {
			t.Errorf("row %q: want tenant, tasks waiting, first place, last expected in", r)
		}
	}
	var note string
	b.run(t, "read #room", chromedp.Text("#room", &note, chromedp.ByQuery))
	if !strings.Contains(note, "tasks wait; the last is expected to start in") {
		t.Errorf("#room says %q", note)
	}
	b.check(t) // no dialog, no exception
}

// openDashboard serves a dashboard of tg's keys under /ops, opens page
// (relative to it: "" for the overview) in headless Chromium, and returns
// the browser and the dashboard's base URL.
func openDashboard(t *testing.T, chromium string, tg *redistest.Target, page string) (*browser, string) {
	t.Helper()
	h, err := dashboard.New(tg.Client, dashboard.WithPrefix(tg.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.StripPrefix("/ops", h))
	t.Cleanup(srv.Close)
	b := startBrowser(t, chromium)
	base := srv.URL + "/ops/"
	b.run(t, "load "+base+page, chromedp.Navigate(base+page))
	return b, base
}

// keyPage is the dashboard's page of the limiter name's key.
func keyPage(name, key string) string {
	return "key?" + url.Values{"name": {name}, "key": {key}}.Encode()
}
