package worker_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
)

// TestLivePolicyChangesTheFleetsRate: two asynq servers work through a
// backlog under a named GCRA limiter of 10/s. Three seconds in, an
// operator stores 20/s for it; three seconds later, unsets it. On the
// Redis clock, where the limiter decides: every 1-second window before the
// change holds at most 11 admissions (10/s and a burst of 1); every window
// from the change on at most 21; every window starting a second after the
// unset at most 11 again; and from a second after the change until the
// unset the fleet ran at least 16/s (80% of 20/s: the backlog got the
// raise). Every task runs once; none is archived.
func TestLivePolicyChangesTheFleetsRate(t *testing.T) {
	const follow = time.Second // the promise: applied within a second
	tg := redistest.New(t)
	ctx := context.Background()
	limiter, err := throttle.New(tg.NewClient(t), "partner-api", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1},
		throttle.WithPrefix(tg.Prefix), throttle.WithLivePolicies())
	if err != nil {
		t.Fatal(err)
	}
	store, err := throttle.NewPolicyStore(tg.Client, tg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	var seen asynqtest.Events
	th := asynqtest.NewThrottler(t, tg, []worker.Rule{worker.Rate("partner", worker.AnyTask(), limiter, worker.KeyBy(worker.Constant("acme")))},
		worker.WithObserver(&seen))
	var log asynqtest.RunLog
	f := asynqtest.NewFleet(t, tg, 2, 10, th, log.Handler(5*time.Millisecond))
	var ids []string
	for i := range 150 {
		ids = append(ids, f.Enqueue(t, "partner:sync", map[string]int{"n": i}))
	}
	for log.Count() == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(3 * time.Second)
	if err := store.Set(ctx, "partner-api", throttle.GCRA{Rate: throttle.PerSecond(20), Burst: 1}); err != nil {
		t.Fatal(err)
	}
	set := time.Now()
	time.Sleep(3 * time.Second)
	if err := store.Unset(ctx, "partner-api"); err != nil {
		t.Fatal(err)
	}
	unset := time.Now()
	info := f.WaitDone(t, &log, len(ids), 60*time.Second)
	runs := log.Snapshot()
	asynqtest.CheckOnce(t, runs, ids)
	if info.Archived != 0 || info.Failed != 0 {
		t.Errorf("%d archived, %d failed; want none", info.Archived, info.Failed)
	}

	// The change and the unset on the Redis clock.
	offset := redistest.ClockOffset(t, tg.Client)
	setR, unsetR := set.Add(offset), unset.Add(offset)
	var slots []time.Time
	for _, s := range seen.Slots() {
		slots = append(slots, s)
	}
	slices.SortFunc(slots, func(a, b time.Time) int { return a.Compare(b) })
	if len(slots) != len(ids) {
		t.Fatalf("%d admissions reported for %d tasks", len(slots), len(ids))
	}
	// most returns the most admissions in a 1-second window starting in
	// [from, to).
	most := func(from, to time.Time) int {
		best := 0
		for i, s := range slots {
			if s.Before(from) || !s.Before(to) {
				continue
			}
			n := 0
			for _, u := range slots[i:] {
				if u.Sub(s) >= time.Second {
					break
				}
				n++
			}
			best = max(best, n)
		}
		return best
	}
	count := func(from, to time.Time) int {
		n := 0
		for _, s := range slots {
			if !s.Before(from) && s.Before(to) {
				n++
			}
		}
		return n
	}
	if n := most(slots[0], setR.Add(-time.Second)); n > 11 {
		t.Errorf("before the change: %d admissions in one second; 10/s allows 11", n)
	}
	if n := most(setR.Add(-time.Second), unsetR.Add(follow)); n > 21 {
		t.Errorf("from the change: %d admissions in one second; 20/s allows 21", n)
	}
	if n := most(unsetR.Add(follow), slots[len(slots)-1].Add(time.Second)); n > 11 {
		t.Errorf("a second after the unset: %d admissions in one second; 10/s allows 11", n)
	}
	raised := unsetR.Sub(setR.Add(follow))
	got := float64(count(setR.Add(follow), unsetR)) / raised.Seconds()
	if got < 16 {
		t.Errorf("from a second after the change to the unset the fleet ran at %.1f/s; want at least 16/s of the 20/s set", got)
	}
	// When the raise took: the first 1-second window after the change
	// holding more than 11.
	took := time.Duration(-1)
	for _, s := range slots {
		if s.After(setR) && count(s, s.Add(time.Second)) > 11 {
			took = s.Sub(setR)
			break
		}
	}
	t.Logf("figures: before %.1f/s, raised %.1f/s (a window over 11 began %s after the change), after the unset %.1f/s",
		float64(count(slots[0], setR))/setR.Sub(slots[0]).Seconds(), got, took,
		float64(count(unsetR.Add(follow), slots[len(slots)-1]))/slots[len(slots)-1].Sub(unsetR.Add(follow)).Seconds())
}
