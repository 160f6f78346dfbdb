package worker_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
)

// TestTaskCostsAreCountedInUnits: tasks that cost 1 (tenant "small") and 3
// (tenant "big") units of a 20-units-a-second GCRA (burst 4), shared
// fairly between the tenants in the rule's waiting room. On the Redis
// clock, no span from one admission to another holds more units than the
// policy allows (4 + 20/s × the span); while both tenants have a backlog
// each gets at least 70% of its half of the units (10 units/s: the big
// tenant runs a third as many tasks); a task costing 5 units, more than
// the burst could ever admit, fails with throttle.ErrExceedsLimit.
func TestTaskCostsAreCountedInUnits(t *testing.T) {
	tg := redistest.New(t)
	limiter := asynqtest.NewLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(20), Burst: 4})
	var seen asynqtest.Events
	tenant := worker.ByPayloadField("tenant")
	units := worker.ByPayloadField("units")
	cost := func(ctx context.Context, at *asynq.Task) (int, error) {
		s, err := units(ctx, at)
		if err != nil {
			return 0, err
		}
		return strconv.Atoi(s)
	}
	th := asynqtest.NewThrottler(t, tg, []worker.Rule{
		worker.Rate("partner", worker.AnyTask(), limiter, worker.KeyBy(worker.Constant("partner")), worker.FairBy(tenant), worker.Cost(cost)),
	}, worker.WithObserver(&seen))
	var log asynqtest.RunLog
	f := asynqtest.NewFleet(t, tg, 2, 10, th, log.Handler(5*time.Millisecond))
	unitsOf := map[string]int{}
	var ids []string
	for i := range 90 {
		id := f.Enqueue(t, "partner:call", map[string]any{"tenant": "small", "units": 1, "n": i})
		ids, unitsOf[id] = append(ids, id), 1
		if i%3 == 0 {
			id := f.Enqueue(t, "partner:call", map[string]any{"tenant": "big", "units": 3, "n": i})
			ids, unitsOf[id] = append(ids, id), 3
		}
	}
	f.Enqueue(t, "partner:call", map[string]any{"tenant": "huge", "units": 5})
	info := f.WaitDone(t, &log, len(ids), 60*time.Second)
	runs := log.Snapshot()
	asynqtest.CheckOnce(t, runs, ids)
	if info.Archived != 1 {
		t.Errorf("%d archived; want the huge task alone (it failed once, without retries)", info.Archived)
	}
	exceeded := 0
	for _, e := range seen.All() {
		if e.Kind == worker.Failed && errors.Is(e.Err, throttle.ErrExceedsLimit) {
			exceeded++
		}
	}
	if exceeded != 1 {
		t.Errorf("%d failures wrapping ErrExceedsLimit, want 1 (the 5-unit task)", exceeded)
	}

	// Units on the Redis clock.
	slots := seen.Slots()
	var admitted []asynqtest.Admission
	for _, r := range runs {
		admitted = append(admitted, asynqtest.Admission{At: slots[r.TaskID], Units: unitsOf[r.ID]})
	}
	asynqtest.CheckMeterUnits(t, admitted, throttle.PerSecond(20), 4)
	// Fair shares in units while both had a backlog: until the big
	// tenant's last run.
	byTenant := map[string][]asynqtest.Run{}
	for _, r := range runs {
		byTenant[r.Key] = append(byTenant[r.Key], r)
	}
	from, to := runs[0].At, byTenant["big"][len(byTenant["big"])-1].At
	if last := byTenant["small"][len(byTenant["small"])-1].At; last.Before(to) {
		to = last
	}
	rate := func(rs []asynqtest.Run) float64 {
		u := 0
		for _, r := range rs {
			if !r.At.After(to) {
				u += unitsOf[r.ID]
			}
		}
		return float64(u) / to.Sub(from).Seconds()
	}
	small, big := rate(byTenant["small"]), rate(byTenant["big"])
	t.Logf("figures: units/s while both waited (%s): small %.1f, big %.1f", to.Sub(from).Round(time.Millisecond), small, big)
	if small < 7 || big < 7 {
		t.Errorf("units/s: small %.1f, big %.1f; want each at least 7 (70%% of half of 20/s)", small, big)
	}
}
