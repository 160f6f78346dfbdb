package dashboard_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/dashboard"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// answerAllowance is how long after its timeout a request to the dashboard
// may be answered: the HTTP exchange on loopback and the goroutines on a
// busy machine. Measured: 1-3 ms idle, at most 40 ms under -race beside
// the other packages' tests; before the fix, 4.5 s and more.
const answerAllowance = 250 * time.Millisecond

// TestDashboardAnswersWithinItsTimeout: with a Redis that accepts
// connections but never answers, and a client on go-redis's defaults
// (which apply no context to reads and retry them: 5 s and more), every
// page's data and every action is answered 502 within WithTimeout, and a
// Publisher's Close returns when its context ends.
func TestDashboardAnswersWithinItsTimeout(t *testing.T) {
	tg, proxy, client := redistest.Hangable(t)
	ctx := context.Background()

	pub, err := dashboard.NewPublisher(client, dashboard.WithPublishPrefix(tg.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	l, err := throttle.New(client, "partner-api", throttle.GCRA{Rate: throttle.PerMinute(2), Burst: 2},
		throttle.WithPrefix(tg.Prefix), throttle.WithObserver(pub))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := l.Allow(ctx, "tenant-1"); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	const timeout = 500 * time.Millisecond
	h, err := dashboard.New(client, dashboard.WithPrefix(tg.Prefix), dashboard.WithLogger(nil),
		dashboard.WithTimeout(timeout), dashboard.WithActions(token))
	if err != nil {
		t.Fatal(err)
	}
	s := &site{tgt: tg, limiter: l, srv: httptestServer(t, http.StripPrefix("/ops", h))}
	if status, body := s.get(t, "/ops/api/overview"); status != http.StatusOK {
		t.Fatalf("overview while Redis answers: %d %s", status, body)
	}

	// A Publisher that has counts to flush when Redis stops answering.
	late, err := dashboard.NewPublisher(client, dashboard.WithPublishPrefix(tg.Prefix), dashboard.WithPublisherLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	late.ObserveDecision(context.Background(), throttle.Decision{Limiter: "partner-api", Key: "tenant-1", Op: throttle.OpAllow, Outcome: throttle.Admitted, Slot: time.Now()})

	proxy.Pause()
	for _, c := range []struct {
		name string
		do   func() (int, string)
	}{
		{"overview", func() (int, string) { return s.get(t, "/ops/api/overview") }},
		{"limiter", func() (int, string) { return s.get(t, "/ops/api/limiter?"+q("name", "partner-api")) }},
		{"keys", func() (int, string) { return s.get(t, "/ops/api/keys?"+q("name", "partner-api")) }},
		{"key", func() (int, string) { return s.get(t, "/ops/api/key?"+q("name", "partner-api", "key", "tenant-1")) }},
		{"series", func() (int, string) { return s.get(t, "/ops/api/series?"+q("name", "partner-api")) }},
		{"action", func() (int, string) {
			return s.post(t, action("action", "reset", "name", "partner-api", "key", "tenant-1"), nil)
		}},
	} {
		start := time.Now()
		status, body := c.do()
		took := time.Since(start)
		if status != http.StatusBadGateway {
			t.Errorf("%s with Redis hung: %d %s; want 502", c.name, status, body)
		}
		if took > timeout+answerAllowance {
			t.Errorf("%s with Redis hung: answered after %s; WithTimeout is %s", c.name, took.Round(time.Millisecond), timeout)
		}
		t.Logf("%s with Redis hung: %d after %s", c.name, status, took.Round(time.Millisecond))
	}

	closeCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = late.Close(closeCtx)
	if took := time.Since(start); took > 300*time.Millisecond+answerAllowance || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Publisher.Close with Redis hung and 300ms: %v after %s", err, took.Round(time.Millisecond))
	}
}
