package dashboard_test

import (
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
)

// TestEveryRuleCountsItsTenantsInBrowser: README's rules with both
// limiters named, a per-tenant limit (10/s) listed first and an overall
// limit (5/s) shared fairly by tenant, on a real fleet that publishes its
// counts. In headless Chromium: the overview lists both limiters by name
// with the rule that uses each and its policy in code; once the fleet has
// run its 36 tasks, the per-tenant limiter's page counts 12 admitted for
// each of the three tenants and the overall limiter's page 36 for its one
// key, every task counted once by every limiter it passed. Before, the
// per-tenant limiter showed 0 admitted for every tenant while the tenants
// ran at their limits, and the overall one, named too, an empty policy
// and 0/s.
func TestEveryRuleCountsItsTenantsInBrowser(t *testing.T) {
	chromium := findChromium()
	if chromium == "" {
		t.Skip("no Chromium on this machine: install Debian's chromium package (.ci/run does)")
	}
	tg := redistest.New(t)
	client := tg.NewClient(t)
	pub := startPublisher(t, client, tg)
	newLimiter := func(name string, perSecond int) *throttle.Limiter {
		l, err := throttle.New(client, name, throttle.GCRA{Rate: throttle.PerSecond(perSecond), Burst: 1},
			throttle.WithPrefix(tg.Prefix), throttle.WithObserver(pub))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	tenant := worker.ByPayloadField("tenant")
	th := asynqtest.NewThrottler(t, tg, []worker.Rule{
		worker.Rate("tenant", worker.Type("partner:sync"), newLimiter("partner-tenant", 10), worker.KeyBy(tenant)),
		worker.Rate("overall", worker.Type("partner:sync"), newLimiter("partner-overall", 5), worker.KeyBy(worker.Constant("all")), worker.FairBy(tenant)),
	}, worker.WithObserver(pub))
	var log asynqtest.RunLog
	f := asynqtest.NewFleet(t, tg, 2, 5, th, log.Handler(time.Millisecond))
	tenants := []string{"acme", "globex", "initech"}
	const each = 12
	for _, name := range tenants {
		for range each {
			f.Enqueue(t, "partner:sync", map[string]string{"tenant": name})
		}
	}

	b, base := openDashboard(t, chromium, tg, "")
	rows := waitFor(t, b, "both limiters in #limiters with their rules",
		`[...document.querySelectorAll("#limiters tbody tr")].map(tr => [...tr.children].slice(0, 5).map(td => td.textContent).join("|"))`,
		func(rows []string) bool {
			return len(rows) == 2 && strings.Contains(strings.Join(rows, " "), "|tenant|")
		})
	t.Logf("figures: the overview's limiters: %q", rows)
	for _, want := range []string{"partner-overall|overall|rate|gcra:5/1s:1|code", "partner-tenant|tenant|rate|gcra:10/1s:1|code"} {
		if !strings.Contains(strings.Join(rows, "\n"), want) {
			t.Errorf("#limiters rows %q; want one reading %q", rows, want)
		}
	}

	f.WaitDone(t, &log, len(tenants)*each, time.Minute)
	// admitted counts by key, from a limiter's #keys table (the key is the
	// first cell, admitted in 15 minutes the next to last).
	admitted := `[...document.querySelectorAll("#keys tbody tr")].map(tr => tr.children[0].textContent + "=" + tr.children[tr.children.length - 2].textContent)`
	counts := func(rows []string) map[string]int {
		m := map[string]int{}
		for _, r := range rows {
			k, v, _ := strings.Cut(r, "=")
			m[k], _ = strconv.Atoi(v)
		}
		return m
	}
	b.run(t, "load the per-tenant limiter's page", chromedp.Navigate(base+"limiter?"+url.Values{"name": {"partner-tenant"}}.Encode()))
	perTenant := waitFor(t, b, "12 admitted for each tenant in #keys", admitted, func(rows []string) bool {
		m := counts(rows)
		return len(m) == 3 && m["acme"] == each && m["globex"] == each && m["initech"] == each
	})
	var policy string
	b.run(t, "read #policy", chromedp.Text("#policy", &policy, chromedp.ByQuery))
	if policy = strings.Join(strings.Fields(policy), " "); !strings.Contains(policy, "Used by rules tenant") {
		t.Errorf("the per-tenant limiter's #policy does not name its rule: %q", policy)
	}
	b.run(t, "load the overall limiter's page", chromedp.Navigate(base+"limiter?"+url.Values{"name": {"partner-overall"}}.Encode()))
	overall := waitFor(t, b, "36 admitted for the overall key in #keys", admitted, func(rows []string) bool {
		return counts(rows)["all"] == len(tenants)*each
	})
	t.Logf("figures: admitted in 15 min, in the browser: per tenant %q, overall %q", perTenant, overall)
	b.check(t)
}
