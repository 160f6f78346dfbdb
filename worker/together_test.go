package worker_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
	"github.com/redis/go-redis/v9"
)

// scriptTrips counts a client's round trips that run scripts: a script
// call on its own, or a pipeline of them (not a connection's set-up).
type scriptTrips struct{ n atomic.Int64 }

func (c *scriptTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *scriptTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			c.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (c *scriptTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && (cmds[0].Name() == "evalsha" || cmds[0].Name() == "eval") {
			c.n.Add(1)
		}
		return next(ctx, cmds)
	}
}

// TestAdmittedTaskCallsRedisOnce: a task admitted at once by every rule it
// matches, on a fleet of one asynq server, costs its limiters' Redis this
// many round trips before its handler runs, and this many after (a cap's
// release). Caps and windows of any number are asked in one round trip;
// several meters likewise (one script); a meter beside a cap or a window
// still costs a call of its own.
func TestAdmittedTaskCallsRedisOnce(t *testing.T) {
	for _, c := range []struct {
		kinds         []string
		before, after int64
	}{
		{[]string{"rate"}, 1, 0},
		{[]string{"window"}, 1, 0},
		{[]string{"cap"}, 1, 1},
		{[]string{"rate", "rate"}, 1, 0},
		{[]string{"window", "window"}, 1, 0},
		{[]string{"cap", "window"}, 1, 1},
		{[]string{"quota", "window", "cap"}, 1, 1},
		{[]string{"cap", "cap"}, 1, 1},
		{[]string{"window", "rate"}, 2, 0},
		{[]string{"cap", "rate"}, 2, 1},
	} {
		tg := redistest.New(t)
		trips := &scriptTrips{}
		client := tg.NewClient(t)
		client.AddHook(trips)
		var rules []worker.Rule
		for i, k := range c.kinds {
			name := k + string(rune('a'+i))
			var l *throttle.Limiter
			var err error
			switch k {
			case "rate":
				l, err = throttle.New(client, name, throttle.GCRA{Rate: throttle.PerSecond(1000), Burst: 100}, throttle.WithPrefix(tg.Prefix))
			case "window":
				l, err = throttle.New(client, name, throttle.FixedWindow{Limit: 1000, Window: time.Minute}, throttle.WithPrefix(tg.Prefix))
			case "quota":
				l, err = throttle.New(client, name, throttle.Quota{Limit: 1000, Period: throttle.Day}, throttle.WithPrefix(tg.Prefix))
			case "cap":
				conc, err := throttle.NewConcurrencyLimiter(client, name, throttle.Concurrency{Limit: 10, Lease: 10 * time.Second}, throttle.WithPrefix(tg.Prefix))
				if err != nil {
					t.Fatal(err)
				}
				rules = append(rules, worker.Concurrency(name, worker.AnyTask(), conc, worker.KeyBy(worker.Constant("k"))))
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			rules = append(rules, worker.Rate(name, worker.AnyTask(), l, worker.KeyBy(worker.Constant("k"))))
		}
		th, err := worker.New(tg.NewClient(t), rules, worker.WithPrefix(tg.Prefix), worker.WithLogger(nil))
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
		t.Logf("figures: %v: %d round trips before the handler, %d after", c.kinds, before, after)
		if before != c.before || after != c.after {
			t.Errorf("%v: %d round trips before the handler and %d after, want %d and %d", c.kinds, before, after, c.before, c.after)
		}
		if err := th.Close(context.Background()); err != nil {
			t.Error(err)
		}
	}
}
