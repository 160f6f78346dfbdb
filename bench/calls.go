package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// callsMain measures what one call costs Redis at the pace a fleet of
// workers calls, not in a tight loop: ten goroutines take tasks, and each
// task makes two calls 100 ms apart, so Redis sees a call every few
// milliseconds and sits idle between them, as it does under a fleet. Each
// kind of call runs in turn, round after round, and the report gives each
// one's Redis CPU per task (the rate at rest taken out), commands and
// script time per call.
func callsMain(args []string) error {
	fs := flag.NewFlagSet("calls", flag.ExitOnError)
	addr := fs.String("redis", "", "host:port of a Redis the benchmark may write to; empty: start a redis-server on a free loopback port")
	tasks := fs.Int("tasks", 60, "tasks of each kind a round, two calls each")
	rounds := fs.Int("rounds", 3, "rounds, the kinds alternated in each")
	_ = fs.Parse(args)
	if *tasks < 1 || *rounds < 1 {
		return errors.New("calls: -tasks and -rounds must be at least 1")
	}
	at, stop, err := redisAt(*addr)
	if err != nil {
		return err
	}
	defer stop()
	*addr = at
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: *addr, PoolSize: 16, MinIdleConns: 12})
	defer rdb.Close()
	version, err := serverVersion(ctx, rdb)
	if err != nil {
		return err
	}
	kinds, err := callKinds(rdb)
	if err != nil {
		return err
	}
	fmt.Printf("calls benchmark: redis %s at %s, %d cores; 10 goroutines, %d tasks of two calls 100 ms apart, %d rounds\n", version, *addr, numCPU(), *tasks, *rounds)
	fmt.Printf("command: go run . calls %s\n\n", strings.Join(args, " "))
	results := map[string][]callResult{}
	for round := range *rounds {
		for i := range kinds {
			k := kinds[(i+round)%len(kinds)]
			res, err := runCalls(ctx, rdb, k, *tasks)
			if err != nil {
				return fmt.Errorf("calls: %s: %w", k.name, err)
			}
			results[k.name] = append(results[k.name], res)
		}
	}
	w := tabwriter.NewWriter(os.Stdout, 2, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "kind\tRedis CPU µs/task, median (range)\tRedis commands/task\tscript µs/call, median (range)\t")
	for _, k := range kinds {
		rs := results[k.name]
		cpu := make([]float64, len(rs))
		script := make([]float64, len(rs))
		for i, r := range rs {
			cpu[i], script[i] = r.cpuPerTask, r.scriptPerCall
		}
		scriptCol := "—"
		if rs[0].scriptCalls > 0 {
			scriptCol = spread(script)
		}
		fmt.Fprintf(w, "%s\t%s\t%.1f\t%s\t\n", k.name, spread(cpu), rs[len(rs)-1].cmdsPerTask, scriptCol)
	}
	w.Flush()
	fmt.Println("\nkinds:")
	for _, k := range kinds {
		fmt.Printf("  %-8s %s\n", k.name, k.about)
	}
	return nil
}

// callKind is one kind of task: its two calls, made 100 ms apart.
type callKind struct {
	name, about string
	task        func(ctx context.Context) error
}

func callKinds(rdb *redis.Client) ([]callKind, error) {
	noop := redis.NewScript("return 1")
	gcra, err := throttle.New(rdb, "bench-calls-gcra", throttle.GCRA{Rate: throttle.PerSecond(100000), Burst: 1000})
	if err != nil {
		return nil, err
	}
	window, err := throttle.New(rdb, "bench-calls-window", throttle.FixedWindow{Limit: 1000000, Window: time.Second})
	if err != nil {
		return nil, err
	}
	capped, err := throttle.NewConcurrencyLimiter(rdb, "bench-calls-cap", throttle.Concurrency{Limit: 3, Lease: 30 * time.Second})
	if err != nil {
		return nil, err
	}
	twice := func(call func(ctx context.Context) error) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			if err := call(ctx); err != nil {
				return err
			}
			time.Sleep(100 * time.Millisecond)
			return call(ctx)
		}
	}
	return []callKind{
		{"ping", "PING", twice(func(ctx context.Context) error { return rdb.Ping(ctx).Err() })},
		{"script", "EVALSHA of a script that returns 1", twice(func(ctx context.Context) error { return noop.Run(ctx, rdb, nil).Err() })},
		{"gcra", "a GCRA limiter's Allow, far below its rate", twice(func(ctx context.Context) error {
			_, err := gcra.Allow(ctx, "k")
			return err
		})},
		{"window", "a fixed window's Allow, far below its limit", twice(func(ctx context.Context) error {
			_, err := window.Allow(ctx, "k")
			return err
		})},
		{"cap", "a cap of 3: AcquireWait, 100 ms held, Release (a freed slot handed to a waiter)", func(ctx context.Context) error {
			lease, err := capped.AcquireWait(ctx, "k")
			if err != nil {
				return err
			}
			time.Sleep(100 * time.Millisecond)
			return lease.Release(ctx)
		}},
	}, nil
}

// callResult is one kind's round.
type callResult struct {
	cpuPerTask, cmdsPerTask, scriptPerCall float64
	scriptCalls                            int64
}

// runCalls runs tasks of k on ten goroutines and returns what they cost
// Redis, less its rate at rest over the same time, measured just before.
func runCalls(ctx context.Context, rdb *redis.Client, k callKind, tasks int) (callResult, error) {
	idle, err := watch(ctx, rdb, time.Second)
	if err != nil {
		return callResult{}, err
	}
	from, err := snap(ctx, rdb)
	if err != nil {
		return callResult{}, err
	}
	fromScript, err := scriptStats(ctx, rdb)
	if err != nil {
		return callResult{}, err
	}
	work := make(chan struct{}, tasks)
	for range tasks {
		work <- struct{}{}
	}
	close(work)
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range work {
				ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				err := k.task(ctx)
				cancel()
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return callResult{}, err
	}
	to, err := snap(ctx, rdb)
	if err != nil {
		return callResult{}, err
	}
	toScript, err := scriptStats(ctx, rdb)
	if err != nil {
		return callResult{}, err
	}
	run := to.since(from)
	atRest := idle.cpu / idle.elapsed.Seconds() * run.elapsed.Seconds()
	restCmds := float64(idle.cmds) / idle.elapsed.Seconds() * run.elapsed.Seconds()
	res := callResult{
		cpuPerTask:  (run.cpu - atRest) * 1e6 / float64(tasks),
		cmdsPerTask: (float64(run.cmds) - restCmds) / float64(tasks),
		scriptCalls: toScript.calls - fromScript.calls,
	}
	if res.scriptCalls > 0 {
		res.scriptPerCall = float64(toScript.usec-fromScript.usec) / float64(res.scriptCalls)
	}
	return res, nil
}

// scriptTotals are INFO commandstats' counts for EVALSHA: calls, and the
// time spent in them (the commands the scripts run included).
type scriptTotals struct{ calls, usec int64 }

func scriptStats(ctx context.Context, rdb *redis.Client) (scriptTotals, error) {
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return scriptTotals{}, err
	}
	return scriptTotalsOf(info), nil
}

// scriptTotalsOf reads the EVALSHA totals from INFO's commandstats section.
func scriptTotalsOf(info string) scriptTotals {
	var s scriptTotals
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:")
		if !ok {
			continue
		}
		for _, field := range strings.Split(rest, ",") {
			name, value, _ := strings.Cut(field, "=")
			switch name {
			case "calls":
				s.calls, _ = strconv.ParseInt(value, 10, 64)
			case "usec":
				s.usec, _ = strconv.ParseInt(value, 10, 64)
			}
		}
	}
	return s
}

// spread formats values as their median and range.
func spread(values []float64) string {
	sorted := slices.Clone(values)
	slices.Sort(sorted)
	return fmt.Sprintf("%.0f (%.0f-%.0f)", sorted[len(sorted)/2], sorted[0], sorted[len(sorted)-1])
}
