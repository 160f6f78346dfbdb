package dashboard_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/jobthrottle/jobthrottle/dashboard"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// hostileTenant is a tenant an outsider named: were the pages to treat
// caller keys as markup, it would add an image whose error handler opens
// an alert.
const hostileTenant = `<img src=x onerror=alert(1)>"'&`

// browserToken is the dashboard's actions token in the browser test.
const browserToken = "browser-test-token-0123456789"

// browserWait bounds each wait for the page to show something: generous,
// for a busy machine under -race; the checks never depend on speed.
const browserWait = 45 * time.Second

// TestDashboardInBrowser drives the dashboard in headless Chromium while a
// fleet of two asynq servers runs: the overview lists both limiters, a
// limiter's page shows per-second counts that change as the fleet runs and
// the hostile key as text, and a key's page takes actions with the right
// token and refuses them with a wrong one. No page ever opens a dialog or
// throws.
func TestDashboardInBrowser(t *testing.T) {
	chromium := findChromium()
	if chromium == "" {
		t.Skip("no Chromium on this machine: install Debian's chromium package (.ci/run does)")
	}
	tg := redistest.New(t)
	lf := startLiveFleet(t, tg, []string{"acme", hostileTenant}, "globex")

	h, err := dashboard.New(tg.Client, dashboard.WithPrefix(tg.Prefix), dashboard.WithActions(browserToken))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/throttle/", http.StripPrefix("/ops/throttle", h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	base := srv.URL + "/ops/throttle/"
	t.Cleanup(func() {
		if t.Failed() {
			logAPI(t, base, "api/overview", "api/limiter?name="+rateName, "api/key?name="+rateName+"&key=acme")
		}
	})

	b := startBrowser(t, chromium)

	// The overview: a row per limiter, each named by a link.
	b.run(t, "load the overview", chromedp.Navigate(base))
	names := waitFor(t, b, "both limiters in #limiters",
		`[...document.querySelectorAll("#limiters tbody tr td:first-child a")].map(a => a.textContent)`,
		func(names []string) bool {
			return slices.Contains(names, rateName) && slices.Contains(names, lf.capName)
		})
	t.Logf("limiters listed: %q", names)
	var table string
	b.run(t, "read #limiters", chromedp.Text("#limiters", &table, chromedp.ByQuery))
	for _, name := range []string{rateName, lf.capName} {
		if !strings.Contains(table, name) {
			t.Errorf("the limiter %q is listed but not visible in #limiters: %q", name, table)
		}
	}
	waitFor(t, b, "the fleet's two processes in #fleet", `document.getElementById("fleet").textContent`,
		func(s string) bool { return strings.HasPrefix(s, fmt.Sprint(fleetServers, " processes")) })

	// Through to the rate limiter's page.
	b.run(t, "click the rate limiter", chromedp.Click(`//table[@id="limiters"]//a[text()="`+rateName+`"]`, chromedp.BySearch))
	waitFor(t, b, "the limiter's page", `location.pathname + location.search`,
		func(s string) bool { return s == "/ops/throttle/limiter?name="+rateName })
	waitFor(t, b, "#status to say updated", `document.getElementById("status").textContent`,
		func(s string) bool { return strings.HasPrefix(s, "updated ") })
	waitFor(t, b, "the policy in code in #policy", `document.getElementById("policy").textContent`,
		func(s string) bool { return strings.Contains(s, "Policy in force"+ratePolicy.String()+"Fromcode") })

	// The counts per second change as the fleet runs; the steady tenants
	// are held back, so throttled or rescheduled decisions show too.
	legend := `["admitted", "throttled", "rescheduled"].map(s => document.getElementById("now-" + s).textContent)`
	first := waitFor(t, b, "admissions in the chart's legend", legend,
		func(v []string) bool { return len(v) == 3 && v[0] != "0" })
	changed := waitFor(t, b, "the admissions per second to change", legend,
		func(v []string) bool { return len(v) == 3 && v[0] != first[0] })
	t.Logf("admitted, throttled, rescheduled per second: %q, then %q", first, changed)
	for i, v := range append(first, changed...) {
		if n, err := strconv.Atoi(v); err != nil || n < 0 {
			t.Errorf("legend value %d is %q: want a count", i, v)
		}
	}
	waitFor(t, b, "throttled or rescheduled decisions in the legend", legend,
		func(v []string) bool { return len(v) == 3 && (v[1] != "0" || v[2] != "0") })

	// The hostile key is text in the tables, never markup.
	hostileJS, _ := json.Marshal(hostileTenant)
	where := waitFor(t, b, "the hostile key in #keys or #hottest",
		`[...document.querySelectorAll("#keys tbody a, #hottest tbody a")].filter(a => a.textContent === `+string(hostileJS)+`).map(a => a.closest("table").id)`,
		func(tables []string) bool { return len(tables) > 0 })
	t.Logf("the hostile key is listed in %q", where)
	var images int
	b.run(t, "count images", chromedp.Evaluate(`document.querySelectorAll("#keys img, #hottest img, #policy img").length`, &images))
	if images != 0 {
		t.Errorf("%d img elements in the limiter page's tables: a caller key was written as markup", images)
	}

	// The screenshot, once the chart has a few seconds of data and the
	// tables their rows.
	waitFor(t, b, "rows in #hottest and #keys",
		`[document.querySelectorAll("#hottest tbody tr").length, document.querySelectorAll("#keys tbody tr").length]`,
		func(rows []int) bool { return len(rows) == 2 && rows[0] >= 2 && rows[1] >= 3 })
	var shot []byte
	b.run(t, "take a screenshot", chromedp.EmulateViewport(1280, 800), chromedp.Sleep(time.Second), chromedp.FullScreenshot(&shot, 100))
	out := filepath.Join(t.TempDir(), "dashboard.png")
	if os.Getenv("DASHBOARD_SCREENSHOT") == "1" {
		out = filepath.Join("..", "docs", "dashboard.png")
	}
	if err := os.WriteFile(out, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot of the limiter's page: %s (%d bytes)", out, len(shot))

	// The hostile key's page, by its link.
	b.run(t, "click the hostile key", chromedp.Evaluate(
		`[...document.querySelectorAll("#keys tbody a, #hottest tbody a")].find(a => a.textContent === `+string(hostileJS)+`).click(), true`, nil))
	waitFor(t, b, "the key's page", `location.pathname`, func(s string) bool { return s == "/ops/throttle/key" })
	waitFor(t, b, "#status to say updated", `document.getElementById("status").textContent`,
		func(s string) bool { return strings.HasPrefix(s, "updated ") })
	var shown []string
	b.run(t, "read the key's page", chromedp.Evaluate(
		`[document.getElementById("title").textContent, document.getElementById("crumb-key").textContent, document.body.dataset.key, String(document.querySelectorAll("img").length)]`, &shown))
	if want := []string{hostileTenant, hostileTenant, hostileTenant, "0"}; fmt.Sprint(shown) != fmt.Sprint(want) {
		t.Errorf("the key's page shows title, crumb, data-key and images %q; want %q", shown, want)
	}
	waitFor(t, b, "the key's state in #state", `document.getElementById("state").textContent`,
		func(s string) bool { return strings.Contains(s, "Remaining") })

	// Actions: a wrong token is refused, the right one resets and blocks.
	act := func(what, token, button string) string {
		t.Helper()
		b.run(t, what,
			chromedp.Evaluate(`document.getElementById("act-result").textContent = ""`, nil),
			chromedp.SetValue("#token", token, chromedp.ByQuery),
			chromedp.Click(`button[data-act=`+button+`]`, chromedp.ByQuery))
		return waitFor(t, b, "the result of "+what, `document.getElementById("act-result").textContent`,
			func(s string) bool { return s != "" })
	}
	if got := act("reset with a wrong token", "not-the-token-0123456789", "reset"); !strings.HasPrefix(got, "Refused:") {
		t.Errorf("reset with a wrong token: %q; want Refused: …", got)
	}
	if got := act("reset with the token", browserToken, "reset"); !strings.HasPrefix(got, "Done:") {
		t.Errorf("reset with the token: %q; want Done: …", got)
	}
	b.run(t, "set the block's duration", chromedp.SetValue("#duration", "1m", chromedp.ByQuery))
	if got := act("block with the token", browserToken, "block"); !strings.HasPrefix(got, "Done:") {
		t.Errorf("block with the token: %q; want Done: …", got)
	}
	blocked, err := lf.rate.BlockedFor(context.Background(), hostileTenant)
	if err != nil || blocked <= 0 || blocked > time.Minute {
		t.Errorf("after the block, the key is blocked for %s (%v); want up to 1m", blocked, err)
	}
	waitFor(t, b, "#state to say blocked", `document.getElementById("state").textContent`,
		func(s string) bool { return strings.Contains(s, "blocked") })
	if got := act("unblock with the token", browserToken, "unblock"); !strings.HasPrefix(got, "Done:") {
		t.Errorf("unblock with the token: %q; want Done: …", got)
	}
	if blocked, err := lf.rate.BlockedFor(context.Background(), hostileTenant); err != nil || blocked != 0 {
		t.Errorf("after the unblock, the key is blocked for %s (%v); want 0", blocked, err)
	}

	if lf.log.Count() == 0 {
		t.Error("the fleet ran no task")
	}
	b.check(t)
}

// logAPI logs the dashboard's answers to paths under base, for a failed
// test's reader.
func logAPI(t *testing.T, base string, paths ...string) {
	t.Helper()
	for _, path := range paths {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Logf("GET %s: %v", path, err)
			continue
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4000))
		resp.Body.Close()
		t.Logf("GET %s: %s %s", path, resp.Status, body)
	}
}

// findChromium returns the path of a Chromium or Chrome, or "".
func findChromium() string {
	for _, name := range []string{"chromium", "chromium-headless-shell", "google-chrome"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	if _, err := os.Stat("/usr/bin/chromium"); err == nil {
		return "/usr/bin/chromium"
	}
	return ""
}

// browser is one headless Chromium tab, with what its pages did that they
// should not: dialogs opened and exceptions thrown.
type browser struct {
	ctx context.Context

	mu         sync.Mutex
	dialogs    []string
	exceptions []string
}

// startBrowser starts Chromium at path with one tab, stopped when the test
// ends.
func startBrowser(t *testing.T, path string) *browser {
	t.Helper()
	// Not t.TempDir: Chromium's helper processes may still be writing to
	// the profile for a moment after the browser has exited.
	profile, err := os.MkdirTemp("", "dashboard-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for range 20 {
			if os.RemoveAll(profile) == nil {
				return
			}
			time.Sleep(250 * time.Millisecond)
		}
	})
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 800),
		chromedp.UserDataDir(profile),
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	// The whole browser session is bounded, so a stuck page fails the test
	// rather than hanging it.
	timed, cancelTimed := context.WithTimeout(allocCtx, 150*time.Second)
	ctx, cancelTab := chromedp.NewContext(timed, chromedp.WithErrorf(func(string, ...any) {}))
	t.Cleanup(func() { cancelTab(); cancelTimed(); cancelAlloc() })
	b := &browser{ctx: ctx}
	chromedp.ListenTarget(ctx, func(ev any) {
		switch ev := ev.(type) {
		case *page.EventJavascriptDialogOpening:
			b.mu.Lock()
			b.dialogs = append(b.dialogs, fmt.Sprintf("%s %q", ev.Type, ev.Message))
			b.mu.Unlock()
			// Dismissed, so the page goes on and the test reports it.
			go func() { _ = chromedp.Run(ctx, page.HandleJavaScriptDialog(false)) }()
		case *runtime.EventExceptionThrown:
			b.mu.Lock()
			b.exceptions = append(b.exceptions, exceptionText(ev.ExceptionDetails))
			b.mu.Unlock()
		}
	})
	if err := chromedp.Run(ctx); err != nil {
		t.Fatalf("starting Chromium %s: %v", path, err)
	}
	return b
}

func exceptionText(d *runtime.ExceptionDetails) string {
	if d == nil {
		return "an exception"
	}
	text := d.Text
	if d.Exception != nil && d.Exception.Description != "" {
		text += " " + d.Exception.Description
	}
	return fmt.Sprintf("%s (%s:%d)", text, d.URL, d.LineNumber)
}

// run runs actions in the tab and fails the test if they fail.
func (b *browser) run(t *testing.T, what string, actions ...chromedp.Action) {
	t.Helper()
	if err := chromedp.Run(b.ctx, actions...); err != nil {
		b.check(t)
		t.Fatalf("%s: %v", what, err)
	}
}

// check fails the test if a page opened a dialog or threw.
func (b *browser) check(t *testing.T) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.dialogs) > 0 {
		t.Errorf("the pages opened dialogs: %q", b.dialogs)
	}
	if len(b.exceptions) > 0 {
		t.Errorf("the pages threw: %q", b.exceptions)
	}
}

// waitFor evaluates expr in the tab every quarter second until ok accepts
// its value, and returns that value; it fails the test with the last value
// seen after browserWait. (chromedp.Poll would build its predicate with
// new Function, which the dashboard's Content-Security-Policy forbids.)
func waitFor[T any](t *testing.T, b *browser, what, expr string, ok func(T) bool) T {
	t.Helper()
	deadline := time.Now().Add(browserWait)
	for {
		var v T
		err := chromedp.Run(b.ctx, chromedp.Evaluate(expr, &v))
		if err == nil && ok(v) {
			return v
		}
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || time.Now().After(deadline) {
			var status string
			_ = chromedp.Run(b.ctx, chromedp.Evaluate(`document.getElementById("status")?.textContent ?? ""`, &status))
			b.check(t)
			t.Fatalf("waiting %s for %s: last value %v (%v); #status %q", browserWait, what, v, err, status)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
