package worker_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
)

// TestAdmittedTaskCallsRedisOnce: a task admitted at once by every rule it
// matches, on a fleet of one asynq server, costs its limiters' Redis this
// many round trips before its handler runs, and this many after (a cap's
// release): all its rules are asked in one round trip, whatever their
// kinds (caps and windows of any number, and its meters, fair shares
// included, in one script), and all its caps released in one. Rows marked
// spread key each rule by a different value, under a prefix holding a hash
// tag ("…{one}:"): on a Cluster that keeps all their keys in one slot, so
// the task still costs one round trip.
func TestAdmittedTaskCallsRedisOnce(t *testing.T) {
	for _, c := range []struct {
		kinds         []string
		before, after int64
		spread        bool
	}{
		{[]string{"rate"}, 1, 0, false},
		{[]string{"window"}, 1, 0, false},
		{[]string{"cap"}, 1, 1, false},
		{[]string{"rate", "rate"}, 1, 0, false},
		{[]string{"window", "window"}, 1, 0, false},
		{[]string{"cap", "window"}, 1, 1, false},
		{[]string{"quota", "window", "cap"}, 1, 1, false},
		{[]string{"cap", "cap"}, 1, 1, false},
		{[]string{"window", "rate"}, 1, 0, false},
		{[]string{"cap", "rate"}, 1, 1, false},
		{[]string{"cap", "window", "rate", "fair"}, 1, 1, false},
		{[]string{"rate", "rate"}, 1, 0, true},
		{[]string{"window", "rate"}, 1, 0, true},
		{[]string{"cap", "window", "rate", "fair"}, 1, 1, true},
	} {
		tg := redistest.New(t)
		prefix := tg.Prefix
		keyOf := func(int) string { return "k" }
		if c.spread {
			prefix += "{one}:"
			keyOf = func(i int) string { return "k" + string(rune('0'+i)) }
		}
		trips := &roundTrips{scripts: true} // not a connection's set-up
		client := tg.NewClient(t)
		client.AddHook(trips)
		var rules []worker.Rule
		for i, k := range c.kinds {
			name := k + string(rune('a'+i))
			var l *throttle.Limiter
			var err error
			switch k {
			case "rate", "fair":
				l, err = throttle.New(client, name, throttle.GCRA{Rate: throttle.PerSecond(1000), Burst: 100}, throttle.WithPrefix(prefix))
			case "window":
				l, err = throttle.New(client, name, throttle.FixedWindow{Limit: 1000, Window: time.Minute}, throttle.WithPrefix(prefix))
			case "quota":
				l, err = throttle.New(client, name, throttle.Quota{Limit: 1000, Period: throttle.Day}, throttle.WithPrefix(prefix))
			case "cap":
				conc, err := throttle.NewConcurrencyLimiter(client, name, throttle.Concurrency{Limit: 10, Lease: 10 * time.Second}, throttle.WithPrefix(prefix))
				if err != nil {
					t.Fatal(err)
				}
				rules = append(rules, worker.Concurrency(name, worker.AnyTask(), conc, worker.KeyBy(worker.Constant(keyOf(i)))))
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			opts := []worker.RuleOption{worker.KeyBy(worker.Constant(keyOf(i)))}
			if k == "fair" {
				opts = append(opts, worker.FairBy(worker.Constant("tenant")))
			}
			rules = append(rules, worker.Rate(name, worker.AnyTask(), l, opts...))
		}
		th, err := worker.New(tg.NewClient(t), rules, worker.WithPrefix(prefix), worker.WithLogger(nil))
		if err != nil {
			t.Fatal(err)
		}
		var inHandler atomic.Int64
		var log asynqtest.RunLog
		f := asynqtest.NewFleet(t, tg, 1, 1, th, asynq.HandlerFunc(func(ctx context.Context, at *asynq.Task) error {
			inHandler.Store(trips.n.Load())
			log.Add(at.ResultWriter().TaskID(), "")
			return nil
		}))
		// The first task records the limiters in the registry of names
		// (in the background): the second is measured.
		f.Enqueue(t, "x", map[string]any{})
		f.WaitDone(t, &log, 1, 10*time.Second)
		time.Sleep(200 * time.Millisecond)
		start := trips.n.Load()
		f.Enqueue(t, "x", map[string]any{})
		f.WaitDone(t, &log, 2, 10*time.Second)
		before, after := inHandler.Load()-start, trips.n.Load()-inHandler.Load()
		t.Logf("figures: %v (spread %v): %d round trips before the handler, %d after", c.kinds, c.spread, before, after)
		if before != c.before || after != c.after {
			t.Errorf("%v (spread %v): %d round trips before the handler and %d after, want %d and %d", c.kinds, c.spread, before, after, c.before, c.after)
		}
		if err := th.Close(context.Background()); err != nil {
			t.Error(err)
		}
	}
}

// TestTogetherGivesBackOnRefusal: a task under a cap, a window and a meter,
// asked together, refused by one of them, holds nothing afterwards: the
// cap's slot is free, the meter's units and the window's count are as
// before. Refused by the window (its one unit an hour used), and refused by
// the cap (its one slot held elsewhere; the task then waits in its line
// until its context ends).
func TestTogetherGivesBackOnRefusal(t *testing.T) {
	ctx := context.Background()
	tg := redistest.New(t)
	client := tg.NewClient(t)
	conc, err := throttle.NewConcurrencyLimiter(client, "cap", throttle.Concurrency{Limit: 1, Lease: 10 * time.Second}, throttle.WithPrefix(tg.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	window, err := throttle.New(client, "window", throttle.SlidingLog{Limit: 1, Window: time.Hour}, throttle.WithPrefix(tg.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	// Ten an hour: no unit comes back while the test runs (at 10/s one
	// did, on a busy CI machine, between the first task and the Peek).
	meter, err := throttle.New(client, "meter", throttle.GCRA{Rate: throttle.PerHour(10), Burst: 5}, throttle.WithPrefix(tg.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	byKey := worker.KeyBy(worker.ByPayloadField("k"))
	th, err := worker.New(client, []worker.Rule{
		worker.Concurrency("cap", worker.AnyTask(), conc, byKey),
		worker.Rate("window", worker.AnyTask(), window, byKey),
		worker.Rate("meter", worker.AnyTask(), meter, byKey),
	}, worker.WithPrefix(tg.Prefix), worker.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = th.Close(ctx) })
	ran := 0
	mw := th.Middleware(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { ran++; return nil }))
	run := func(ctx context.Context, key string) error {
		return mw.ProcessTask(ctx, asynq.NewTask("x", []byte(`{"k":"`+key+`"}`)))
	}
	holdsNothing := func(key string, meterLeft, windowLeft int) {
		t.Helper()
		if r, err := meter.Peek(ctx, key); err != nil || r.Remaining != meterLeft {
			t.Errorf("meter %s: %d left (%v), want %d", key, r.Remaining, err, meterLeft)
		}
		if r, err := window.Peek(ctx, key); err != nil || r.Remaining != windowLeft {
			t.Errorf("window %s: %d left (%v), want %d", key, r.Remaining, err, windowLeft)
		}
		if r, err := conc.Peek(ctx, key); err != nil || r.Remaining != 1 {
			t.Errorf("cap %s: %d slots free (%v), want 1", key, r.Remaining, err)
		}
	}

	// Refused by the window.
	if err := run(ctx, "a"); err != nil || ran != 1 {
		t.Fatalf("first task: %v, ran %d", err, ran)
	}
	var throttled *worker.ThrottledError
	if err := run(ctx, "a"); !errors.As(err, &throttled) || throttled.Rule != "window" {
		t.Fatalf("second task: %v; want throttled by the window", err)
	}
	holdsNothing("a", 4, 0)

	// Refused by the cap, whose slot is held.
	lease, _, err := conc.Acquire(ctx, "b")
	if err != nil || lease == nil {
		t.Fatal(lease, err)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := run(short, "b"); err == nil || ran != 1 {
		t.Fatalf("a task while the cap is full: %v, ran %d; want it refused", err, ran)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	holdsNothing("b", 5, 1)
}
