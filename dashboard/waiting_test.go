package dashboard_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/dashboard"
	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
)

// TestKeyPageSaysWhoWaitsAndForHowLong: a fleet works through three
// tenants' backlogs under an overall limit of 10/s shared fairly (gold
// weighs 2). Once the tasks wait in the overall key's waiting room, the
// key's page lists each tenant's waiting tasks, the place of its first and
// when its last is expected to start; each tenant's last task then starts
// within 20% of that (and StartJitter, the measured lateness of a
// handler's start after its slot).
func TestKeyPageSaysWhoWaitsAndForHowLong(t *testing.T) {
	tg := redistest.New(t)
	overall, th := fairOverall(t, tg, 10, worker.Weights(func(f string) int { return map[string]int{"gold": 2}[f] }))
	var log asynqtest.RunLog
	f := asynqtest.NewFleet(t, tg, 2, 5, th, log.Handler(5*time.Millisecond))
	tasks := map[string]int{"gold": 24, "b": 12, "c": 12}
	for tenant, n := range tasks {
		for range n {
			f.Enqueue(t, "partner:sync", map[string]string{"tenant": tenant})
		}
	}
	h, err := dashboard.New(tg.Client, dashboard.WithPrefix(tg.Prefix), dashboard.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	s := &site{tgt: tg, limiter: overall, srv: httptestServer(t, http.StripPrefix("/ops", h))}
	var key struct {
		Bookings struct {
			Waiting        int64 `json:"waiting"`
			ExpectedWaitMs int64 `json:"expectedWaitMs"`
			Flows          []struct {
				Flow           string `json:"flow"`
				Waiting        int    `json:"waiting"`
				First          int    `json:"first"`
				ExpectedWaitMs int64  `json:"expectedWaitMs"`
			} `json:"flows"`
		} `json:"bookings"`
	}
	var read time.Time
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		read = time.Now()
		// 404 until the limiter has decided and is known.
		if status, body := s.get(t, "/ops/api/key?"+q("name", "partner-overall", "key", "all")); status == http.StatusOK {
			if err := json.Unmarshal([]byte(body), &key); err != nil {
				t.Fatal(err)
			}
			// Every task not yet started has reached the room (but the two
			// or three let out and on their way): what the page's estimate
			// covers.
			if key.Bookings.Waiting+int64(log.Count()) >= 45 && key.Bookings.Waiting >= 20 && len(key.Bookings.Flows) == 3 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the waiting room never held the 20 and more tasks of three tenants yet to start (%d started): %+v", log.Count(), key.Bookings)
		}
	}
	t.Logf("figures: waiting room read: %+v", key.Bookings)
	f.WaitDone(t, &log, 48, 30*time.Second)
	last := map[string]time.Time{}
	for _, r := range log.Snapshot() {
		if r.At.After(last[r.Key]) {
			last[r.Key] = r.At
		}
	}
	var most int64
	for _, fl := range key.Bookings.Flows {
		expected := time.Duration(fl.ExpectedWaitMs) * time.Millisecond
		actual := last[fl.Flow].Sub(read)
		t.Logf("figures: tenant %s: %d waiting, first at place %d; its last expected to start in %s, started in %s",
			fl.Flow, fl.Waiting, fl.First, expected, actual.Round(time.Millisecond))
		if diff := (actual - expected).Abs(); diff > expected/5+asynqtest.StartJitter {
			t.Errorf("tenant %s's last task started %s after the page was read; it said %s (±20%% and %s)", fl.Flow, actual.Round(time.Millisecond), expected, asynqtest.StartJitter)
		}
		if fl.Waiting < 1 || fl.Waiting > tasks[fl.Flow] || fl.First < 1 {
			t.Errorf("tenant %s: %d waiting, first at place %d", fl.Flow, fl.Waiting, fl.First)
		}
		most = max(most, fl.ExpectedWaitMs)
	}
	if key.Bookings.ExpectedWaitMs != most {
		t.Errorf("the room's expected wait %d ms, its flows' longest %d ms", key.Bookings.ExpectedWaitMs, most)
	}
}

// fairOverall returns the limiter "partner-overall", GCRA perSecond with a
// burst of 1, and a Throttler whose one rule shares it fairly by the
// payload's tenant under one key, "all", with opts added; tasks that must
// wait do so in the waiting room, none in its handler.
func fairOverall(t *testing.T, tg *redistest.Target, perSecond int, opts ...worker.RuleOption) (*throttle.Limiter, *worker.Throttler) {
	t.Helper()
	overall, err := throttle.New(tg.NewClient(t), "partner-overall", throttle.GCRA{Rate: throttle.PerSecond(perSecond), Burst: 1}, throttle.WithPrefix(tg.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	rule := worker.Rate("overall", worker.Type("partner:sync"), overall,
		append([]worker.RuleOption{worker.KeyBy(worker.Constant("all")), worker.FairBy(worker.ByPayloadField("tenant"))}, opts...)...)
	return overall, asynqtest.NewThrottler(t, tg, []worker.Rule{rule}, worker.WithInlineWait(0))
}
