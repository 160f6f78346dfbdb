package main

import (
	"bufio"
	"context"
	"encoding/json"
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
)

// fleetQueue is the one queue the fleet's tasks go to.
const fleetQueue = "fleet"

// fleetChild is one worker process of the fleet: an asynq server
// (Concurrency 10) whose handler reports each start ("S <unix ns>
// <tenant>") and end ("D") on stdout, behind the scenario's rules unless
// plain. The library's limiters and Throttler use a client of their own,
// so that their round trips are counted apart from asynq's, or, with
// JT_FLEET_ONE_CLIENT=1, asynq's client, their round trips told apart by
// their scripts and keys (ofLibrary); "count" on stdin prints them,
// the PINGs among them and the tasks sent back to asynq so far ("R <n>
// <pings> <back>"). It stops when stdin ends.
func fleetChild() int {
	sc, ok := scenarioNamed(os.Getenv(childScenario))
	if !ok {
		fmt.Fprintln(os.Stderr, "fleet child: unknown scenario", os.Getenv(childScenario))
		return 2
	}
	addr := os.Getenv(childAddr)
	asynqRDB := redis.NewClient(&redis.Options{Addr: addr})
	libRDB := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
	trips := &counter{}
	if os.Getenv(childOneClient) == "1" {
		if err := loadLibrarySHAs(); err != nil {
			fmt.Fprintln(os.Stderr, "fleet child:", err)
			return 1
		}
		asynqRDB, trips.libraryOnly = libRDB, true
	}
	libRDB.AddHook(trips)
	var detail *tally
	if os.Getenv("JT_FLEET_DETAIL") == "1" {
		detail = newTally()
		libRDB.AddHook(detail)
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
	var h asynq.Handler = asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		var p struct{ Tenant string }
		_ = json.Unmarshal(task.Payload(), &p)
		say("S %d %s", time.Now().UnixNano(), p.Tenant)
		time.Sleep(sc.work)
		say("D")
		return nil
	})
	var th *worker.Throttler
	var back atomic.Int64 // tasks sent back to asynq (worker.Rescheduled)
	if os.Getenv(childPlain) != "1" {
		rules, err := sc.rules(libRDB)
		if err == nil {
			th, err = worker.New(libRDB, rules, worker.WithLogger(nil), worker.WithObserver(worker.ObserverFunc(func(_ context.Context, e worker.Event) {
				if e.Kind == worker.Rescheduled {
					back.Add(1)
				}
			})))
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
		if in.Text() == "count" {
			say("R %d %d %d", trips.n.Load(), trips.pings.Load(), back.Load())
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
