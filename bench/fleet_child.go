package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/worker"
	"github.com/redis/go-redis/v9"
)

// The environment a worker process of the fleet benchmark is started with
// (the benchmark starts its own binary again, once per process).
const (
	childScenario = "JT_FLEET_SCENARIO" // the scenario's name; set only in a child
	childAddr     = "JT_FLEET_ADDR"
	childPlain    = "JT_FLEET_PLAIN" // "1": no middleware, asynq alone
	// "<TaskCheckInterval>,<DelayedTaskCheckInterval>" for asynq's Config;
	// unset: what Configure sets (or asynq's defaults, plain)
	childPoll = "JT_FLEET_POLL"
	// "1": asynq, the Throttler and its limiters share one client
	childOneClient = "JT_FLEET_ONE_CLIENT"
	// "1": without the middleware, each task goes back once through
	// asynq's retry before it runs
	childBackOnce = "JT_FLEET_BACK_ONCE"
	// worker.WithInlineWait's duration; unset: the default
	childInline = "JT_FLEET_INLINE"
	// "1": the process opens its clients' connections before it is
	// watched at rest (see warmPool)
	childWarm = "JT_FLEET_WARM"
	// "1": the library's scripts run as timed copies (see profile.go)
	childProfile = "JT_FLEET_PROFILE"
)

// warmConns is how many connections warmPool opens in each client: the
// asynq server's 10 workers and its own few goroutines, at once.
const warmConns = 16

// warmPool opens n connections of rdb at once and leaves them idle in its
// pool, as in a process that has been running a while: a connection's
// set-up costs Redis about 100 µs of CPU (HELLO, CLIENT SETINFO; 120 µs
// with its PING, against 11-22 µs for a PING on an open one, measured
// with 2,000 of each on redis-server 7.0.15 here), which a short run
// would otherwise count against its first tasks.
func warmPool(rdb *redis.Client, n int) {
	var wg sync.WaitGroup
	ctx := context.Background()
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = rdb.Do(ctx, "PING").Err()
		}()
	}
	wg.Wait()
}

// fleetQueue is the one queue the fleet's tasks go to.
const fleetQueue = "fleet"

// fleetChild is one worker process of the fleet: an asynq server
// (Concurrency 10) whose handler reports each start ("S <unix ns>
// <tenant>") and end ("D") on stdout, behind the scenario's rules unless
// plain. The library's limiters and Throttler use a client of their own,
// so that their round trips are counted apart from asynq's, or, with
// JT_FLEET_ONE_CLIENT=1, asynq's client, their round trips told apart by
// their scripts and keys (ofLibrary); "count" on stdin prints them,
// the PINGs among them, the tasks sent back to asynq so far and the
// registry's writes among the round trips ("R <n> <pings> <back>
// <registry>"); "tasks" prints each task's (see tasksOf). It stops when stdin ends.
func fleetChild() int {
	sc, ok := scenarioNamed(os.Getenv(childScenario))
	if !ok {
		fmt.Fprintln(os.Stderr, "fleet child: unknown scenario", os.Getenv(childScenario))
		return 2
	}
	addr := os.Getenv(childAddr)
	asynqRDB := redis.NewClient(&redis.Options{Addr: addr})
	libRDB := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
	trips := &counter{byTask: &taskTrips{n: map[string]int64{}}}
	if os.Getenv(childOneClient) == "1" {
		if err := loadLibrarySHAs(); err != nil {
			fmt.Fprintln(os.Stderr, "fleet child:", err)
			return 1
		}
		asynqRDB, trips.libraryOnly = libRDB, true
	}
	if os.Getenv(childWarm) == "1" {
		// Before the hooks, so that these PINGs are not counted.
		warmPool(libRDB, warmConns)
		if asynqRDB != libRDB {
			warmPool(asynqRDB, warmConns)
		}
	}
	libRDB.AddHook(trips)
	var detail *tally
	if os.Getenv("JT_FLEET_DETAIL") == "1" {
		detail = newTally()
		libRDB.AddHook(detail)
	}
	if os.Getenv(childProfile) == "1" {
		if err := timeScripts(context.Background(), libRDB); err != nil {
			fmt.Fprintln(os.Stderr, "fleet child:", err)
			return 1
		}
	}

	var mu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, format+"\n", args...)
		_ = out.Flush()
	}
	cfg := asynq.Config{Concurrency: 10, Queues: map[string]int{fleetQueue: 1}, LogLevel: asynq.FatalLevel}
	if poll, forward, ok := strings.Cut(os.Getenv(childPoll), ","); ok {
		cfg.TaskCheckInterval, _ = time.ParseDuration(poll)
		cfg.DelayedTaskCheckInterval, _ = time.ParseDuration(forward)
	}
	var back atomic.Int64 // tasks sent back to asynq (worker.Rescheduled, or plain ones sent back once)
	var wentBack sync.Map // the IDs of the tasks sent back
	backOnce := os.Getenv(childPlain) == "1" && os.Getenv(childBackOnce) == "1"
	if backOnce {
		// asynq's own way back, as a plain fleet would throttle. The retry
		// counts as a failure (two counters more in asynq's retry than the
		// library's way back), so that the task's retry count tells any
		// process of the fleet that it has been back once.
		cfg.RetryDelayFunc = func(int, error, *asynq.Task) time.Duration { return time.Second }
	}
	var h asynq.Handler = asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		if backOnce {
			if tries, _ := asynq.GetRetryCount(ctx); tries == 0 {
				back.Add(1)
				wentBack.Store(task.ResultWriter().TaskID(), true)
				return errors.New("fleet: back once")
			}
		}
		var p struct{ Tenant string }
		_ = json.Unmarshal(task.Payload(), &p)
		say("S %d %s", time.Now().UnixNano(), p.Tenant)
		time.Sleep(sc.work)
		say("D")
		return nil
	})
	var th *worker.Throttler
	if os.Getenv(childPlain) != "1" {
		rules, err := sc.rules(libRDB)
		if err == nil {
			opts := []worker.Option{worker.WithLogger(nil)}
			if d, perr := time.ParseDuration(os.Getenv(childInline)); perr == nil {
				opts = append(opts, worker.WithInlineWait(d))
			}
			opts = append(opts, worker.WithObserver(worker.ObserverFunc(func(_ context.Context, e worker.Event) {
				if e.Kind == worker.Rescheduled {
					back.Add(1)
					wentBack.Store(e.TaskID, true)
				}
			})))
			th, err = worker.New(libRDB, rules, opts...)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "fleet child:", err)
			return 1
		}
		th.Configure(&cfg)
		h = th.Middleware(h)
	}
	srv := asynq.NewServerFromRedisClient(asynqRDB, cfg)
	if err := srv.Start(h); err != nil {
		fmt.Fprintln(os.Stderr, "fleet child:", err)
		return 1
	}
	say("READY")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch in.Text() {
		case "count":
			say("R %d %d %d %d", trips.n.Load(), trips.pings.Load(), back.Load(), trips.registry.Load())
		case "tasks":
			// Every task this process made round trips for or sent back:
			// "T <ID> <round trips> <1 if sent back>", then "TEND".
			byTask := trips.byTask.snapshot()
			wentBack.Range(func(id, _ any) bool {
				if _, ok := byTask[id.(string)]; !ok {
					byTask[id.(string)] = 0
				}
				return true
			})
			for id, n := range byTask {
				_, sent := wentBack.Load(id)
				say("T %s %d %d", id, n, boolInt(sent))
			}
			say("TEND")
		}
	}
	srv.Shutdown()
	if detail != nil {
		detail.print()
	}
	if th != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = th.Close(ctx)
	}
	return 0
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
