package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// fleetMain runs the fleet benchmark: for each scenario and each fleet size
// N, N separate worker processes (asynq servers of Concurrency 10 behind
// the scenario's rules) work through the scenario's tasks on one Redis,
// and the benchmark prints what the fleet achieved and what it cost Redis,
// beside the same fleet without the middleware (plain asynq) and at rest.
// JT_FLEET_DETAIL=1 has each worker process print its library round trips
// by script or command to stderr when it stops.
//
//	cd bench && go run . fleet                      # starts a redis-server on loopback
//	cd bench && go run . fleet -n 1,4 -scale 0.25   # a quicker run
//	cd bench && go run . fleet -redis 127.0.0.1:6379  # FLUSHALLs that Redis
func fleetMain(args []string) error {
	fs := flag.NewFlagSet("fleet", flag.ExitOnError)
	addr := fs.String("redis", "", "host:port of a Redis the benchmark may empty (FLUSHALL); empty: start a redis-server on a free loopback port")
	sizes := fs.String("n", "1,4,12,24", "fleet sizes: worker processes, comma-separated")
	only := fs.String("scenarios", "", "scenarios to run, comma-separated; empty: all")
	scale := fs.Float64("scale", 1, "fraction of each scenario's tasks to run (0.25 for a quick look)")
	idleFor := fs.Duration("idle", 3*time.Second, "how long each fleet is watched at rest before its tasks are enqueued")
	withPlain := fs.Bool("plain", true, "run each fleet again without the middleware (plain asynq), beside it")
	rounds := fs.Int("rounds", 1, "times each fleet runs, the library and plain asynq alternated, for the median ratio of their throughputs")
	poll := fs.String("poll", "", "asynq's TaskCheckInterval and DelayedTaskCheckInterval for every worker, as \"1s,5s\"; empty: what Throttler.Configure sets (asynq's defaults for plain asynq)")
	backOnce := fs.Bool("plain-back-once", false, "plain asynq sends each task back once through its own retry (1 s later, counted as a failure so that its retry count tells any process) before running it: what asynq alone spends on a task that goes back, the floor under the library's")
	inline := fs.Duration("inline-wait", 0, "worker.WithInlineWait for every worker process; 0: the default")
	oneClient := fs.Bool("one-client", false, "asynq, the Throttler and its limiters on one go-redis client per worker process, as a user sets them up; the library's round trips are then told apart from asynq's by their scripts and keys (see ofLibrary)")
	batches := fs.Int("batches", 1, "times each fleet runs its scenario's tasks in a row, each batch enqueued once the last is done; Redis's work is added up over the batches (the enqueueing left out), so that more batches average out the fleet's own periodic work (asynq's heartbeats, its forwarder) that one short run catches by chance")
	profile := fs.Bool("profile-scripts", false, "each worker process runs timed copies of the library's scripts, and each fleet's table is followed by the calls a task and the µs a call of each script and mode, timed inside Redis (a few µs a call high: the timing's own commands)")
	pin := fs.Bool("pin", false, "give Redis (on this machine) a CPU of its own, the first the benchmark may use, and the worker processes the others, as a shared Redis runs on a machine of its own; Linux only")
	warm := fs.Bool("warm", false, "each worker process opens 16 connections of each of its clients before it is watched at rest, as a process that has run a while has them; otherwise the pools grow as the tasks come, and each connection's set-up (about 100 µs of Redis CPU) counts against the tasks")
	_ = fs.Parse(args)
	var childEnv []string
	if *poll != "" {
		childEnv = append(childEnv, childPoll+"="+*poll)
	}
	if *oneClient {
		childEnv = append(childEnv, childOneClient+"=1")
	}
	if *inline > 0 {
		childEnv = append(childEnv, childInline+"="+inline.String())
	}
	if *backOnce {
		childEnv = append(childEnv, childBackOnce+"=1")
	}
	if *warm {
		childEnv = append(childEnv, childWarm+"=1")
	}
	if *profile {
		childEnv = append(childEnv, childProfile+"=1")
	}
	var ns []int
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > 64 {
			return fmt.Errorf("fleet: bad size %q in -n", s)
		}
		ns = append(ns, n)
	}
	chosen := scenarios
	if *only != "" {
		chosen = nil
		for _, name := range strings.Split(*only, ",") {
			sc, ok := scenarioNamed(strings.TrimSpace(name))
			if !ok {
				return fmt.Errorf("fleet: no scenario %q", name)
			}
			chosen = append(chosen, sc)
		}
	}
	at, stop, err := redisAt(*addr)
	if err != nil {
		return err
	}
	defer stop()
	*addr = at
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: *addr})
	defer admin.Close()
	version, err := serverVersion(ctx, admin)
	if err != nil {
		return err
	}
	fmt.Printf("fleet benchmark: redis %s at %s, %d cores; worker processes of asynq Concurrency 10\n", version, *addr, numCPU())
	if *pin {
		pinned, err := pinApart(ctx, admin, *addr)
		if err != nil {
			return err
		}
		fmt.Println(pinned)
	}
	fmt.Printf("command: go run . fleet %s\n\n", strings.Join(args, " "))
	var idles []idleRow
	for _, sc := range chosen {
		sc.tasks = max(sc.tenants, int(float64(sc.tasks)**scale))
		fmt.Printf("%s: %s; %d tasks over %d tenants, handlers of %s\n", sc.name, sc.about, sc.tasks, sc.tenants, sc.work)
		var rows []fleetRow
		var ratios []string
		var profiles []func()
		for _, n := range ns {
			var lib, bare []float64
			for round := range max(1, *rounds) {
				// Alternated, so that a drift of the machine falls on both.
				order := []bool{false, true}
				if round%2 == 1 {
					order = []bool{true, false}
				}
				for _, plain := range order {
					if plain && !*withPlain {
						continue
					}
					res, err := runFleet(ctx, admin, *addr, sc, n, plain, *idleFor, max(1, *batches), *profile && !plain, childEnv)
					if err != nil {
						return fmt.Errorf("fleet: %s, N=%d, plain=%v: %w", sc.name, n, plain, err)
					}
					row := res.row(sc, n, plain)
					rows = append(rows, row)
					if res.scripts != nil {
						profiles = append(profiles, func() { printScriptTimes(os.Stdout, n, res.tasks, res.scripts) })
					}
					idles = append(idles, res.atRest(n, plain, sc.name))
					if plain {
						bare = append(bare, row.overall)
					} else {
						lib = append(lib, row.overall)
					}
				}
			}
			if len(bare) == len(lib) && len(lib) > 0 {
				ratios = append(ratios, throughputRatio(n, lib, bare))
			}
		}
		printFleetRows(os.Stdout, sc, rows)
		for _, p := range profiles {
			p()
		}
		for _, r := range ratios {
			fmt.Println(r)
		}
		fmt.Println()
	}
	printIdleRows(os.Stdout, idles)
	return nil
}

// throughputRatio says how the library's fleet of n processes compared
// with plain asynq's: each round's ratio of their tasks a second, and the
// median of those.
func throughputRatio(n int, lib, bare []float64) string {
	var each []float64
	var parts []string
	for i := range lib {
		each = append(each, lib[i]/bare[i])
		parts = append(parts, fmt.Sprintf("%.2f", lib[i]/bare[i]))
	}
	slices.Sort(each)
	median := each[len(each)/2]
	if len(each)%2 == 0 {
		median = (each[len(each)/2-1] + each[len(each)/2]) / 2
	}
	return fmt.Sprintf("  N=%d: tasks a second with the library / plain asynq, round by round: %s; median %.2f×", n, strings.Join(parts, ", "), median)
}

// fleetEvent is a line a worker process printed.
type fleetEvent struct {
	kind   string // READY, S (a start), D (an end), R (round trips)
	at     int64  // S: when, Unix ns
	tenant string // S
	n      int64  // R: round trips
	pings  int64  // R: PINGs among them
	back   int64  // R: tasks sent back to asynq
	reg    int64  // R: the registry's writes among the round trips
	id     string // T: a task's asynq ID
	sent   bool   // T: the task was sent back by this process
}

// fleetStart is one handler start.
type fleetStart struct {
	at     time.Time
	tenant string
}

// fleetResult is what one run of a fleet measured.
type fleetResult struct {
	tasks   int
	batches [][]fleetStart // each batch's handler starts
	scripts scriptTimes    // with -profile-scripts: the timed scripts' times
	trips   int64
	pings   int64 // of trips: settle's PINGs (worker.WithSettle)
	// of trips: the registry's writes (a limiter's first decision in a
	// process writes its entry, then hourly)
	registry int64
	back     int64 // tasks sent back to asynq (worker.Rescheduled)
	// byTask is each task's library round trips, made with its handler's
	// context, over every process; sentBack the tasks sent back at least
	// once.
	byTask    map[string]int64
	sentBack  map[string]bool
	base      rates // Redis with no worker process
	idle      rates // the fleet at rest
	idleAfter rates // the fleet at rest again, its tasks done
	run       rates // the fleet at work
}

// runFleet starts n worker processes of sc (plain: without the
// middleware), watches them at rest, enqueues sc's tasks into a paused
// queue, lets them go and waits until every task has run, batches times
// in a row; with profile, it adds up the timed scripts' times over the
// batches. childEnv is added to each worker process's environment.
func runFleet(ctx context.Context, admin *redis.Client, addr string, sc scenario, n int, plain bool, idleFor time.Duration, batches int, profile bool, childEnv []string) (fleetResult, error) {
	var res fleetResult
	if err := admin.FlushAll(ctx).Err(); err != nil {
		return res, err
	}
	base, err := watch(ctx, admin, idleFor/2)
	if err != nil {
		return res, err
	}
	res.base = base
	self, err := os.Executable()
	if err != nil {
		return res, err
	}
	events := make(chan fleetEvent, 4096)
	var stdins []interface{ Close() error }
	var cmds []*exec.Cmd
	defer func() {
		for _, in := range stdins {
			_ = in.Close()
		}
		for _, c := range cmds {
			done := make(chan struct{})
			go func() { _ = c.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = c.Process.Kill()
				<-done
			}
		}
	}()
	for range n {
		c := exec.Command(self)
		c.Env = append(os.Environ(), childScenario+"="+sc.name, childAddr+"="+addr)
		if plain {
			c.Env = append(c.Env, childPlain+"=1")
		}
		c.Env = append(c.Env, childEnv...)
		c.Stderr = os.Stderr
		in, err := c.StdinPipe()
		if err != nil {
			return res, err
		}
		out, err := c.StdoutPipe()
		if err != nil {
			return res, err
		}
		if err := c.Start(); err != nil {
			return res, err
		}
		stdins, cmds = append(stdins, in), append(cmds, c)
		go readEvents(out, events)
	}
	ask := func() (fleetEvent, error) {
		var sum fleetEvent
		for _, in := range stdins {
			if _, err := fmt.Fprintln(in.(interface{ Write([]byte) (int, error) }), "count"); err != nil {
				return sum, err
			}
		}
		for got := 0; got < n; {
			e, err := next(events, 30*time.Second)
			if err != nil {
				return sum, err
			}
			if e.kind == "R" {
				sum.n, sum.pings, sum.back, sum.reg = sum.n+e.n, sum.pings+e.pings, sum.back+e.back, sum.reg+e.reg
				got++
			}
		}
		return sum, nil
	}
	for ready := 0; ready < n; {
		e, err := next(events, 60*time.Second)
		if err != nil {
			return res, fmt.Errorf("waiting for the workers to start: %w", err)
		}
		if e.kind == "READY" {
			ready++
		}
	}
	time.Sleep(time.Second) // first polls, heartbeats
	if res.idle, err = watch(ctx, admin, idleFor); err != nil {
		return res, err
	}
	inspector := asynq.NewInspectorFromRedisClient(admin)
	client := asynq.NewClientFromRedisClient(admin)
	limit := 60*time.Second + time.Duration(float64(sc.tasks)/max(sc.ideal, 1)*3*float64(time.Second))
	// Each batch is watched from its queue's unpausing to its last task's
	// end: the enqueueing between batches is left out.
	for range batches {
		// Paused only now: asynq's workers poll a paused queue more cheaply
		// than an empty one, which is what they poll while the tasks wait.
		if err := inspector.PauseQueue(fleetQueue); err != nil {
			return res, err
		}
		for i := range sc.tasks {
			payload := fmt.Sprintf(`{"tenant":"t%d"}`, i%sc.tenants)
			if _, err := client.EnqueueContext(ctx, asynq.NewTask("fleet:task", []byte(payload)), asynq.Queue(fleetQueue)); err != nil {
				return res, err
			}
		}
		before, err := ask()
		if err != nil {
			return res, err
		}
		var timesBefore scriptTimes
		if profile {
			if timesBefore, err = readScriptTimes(ctx, admin); err != nil {
				return res, err
			}
		}
		from, err := snap(ctx, admin)
		if err != nil {
			return res, err
		}
		if err := inspector.UnpauseQueue(fleetQueue); err != nil {
			return res, err
		}
		var starts []fleetStart
		for done := 0; done < sc.tasks; {
			e, err := next(events, limit)
			if err != nil {
				return res, fmt.Errorf("%d of %d tasks done: %w", done, sc.tasks, err)
			}
			switch e.kind {
			case "S":
				starts = append(starts, fleetStart{time.Unix(0, e.at), e.tenant})
			case "D":
				done++
			}
		}
		to, err := snap(ctx, admin)
		if err != nil {
			return res, err
		}
		if profile {
			timesAfter, err := readScriptTimes(ctx, admin)
			if err != nil {
				return res, err
			}
			if res.scripts == nil {
				res.scripts = scriptTimes{}
			}
			res.scripts.add(timesBefore, timesAfter)
		}
		after, err := ask()
		if err != nil {
			return res, err
		}
		res.batches = append(res.batches, starts)
		res.tasks += sc.tasks
		res.trips, res.pings, res.back = res.trips+after.n-before.n, res.pings+after.pings-before.pings, res.back+after.back-before.back
		res.registry += after.reg - before.reg
		res.run = res.run.plus(to.since(from))
	}
	if res.idleAfter, err = watch(ctx, admin, idleFor); err != nil {
		return res, err
	}
	if res.byTask, res.sentBack, err = tasksOf(stdins, events, n); err != nil {
		return res, err
	}
	return res, nil
}

// tasksOf asks each of the n worker processes for its round trips by task
// and the tasks it sent back, and adds them up by task.
func tasksOf(stdins []interface{ Close() error }, events <-chan fleetEvent, n int) (map[string]int64, map[string]bool, error) {
	byTask, sent := map[string]int64{}, map[string]bool{}
	for _, in := range stdins {
		if _, err := fmt.Fprintln(in.(interface{ Write([]byte) (int, error) }), "tasks"); err != nil {
			return nil, nil, err
		}
	}
	for ended := 0; ended < n; {
		e, err := next(events, 30*time.Second)
		if err != nil {
			return nil, nil, err
		}
		switch e.kind {
		case "T":
			byTask[e.id] += e.n
			if e.sent {
				sent[e.id] = true
			}
		case "TEND":
			ended++
		}
	}
	return byTask, sent, nil
}

// readEvents sends the lines a worker process prints as events.
func readEvents(out interface{ Read([]byte) (int, error) }, events chan<- fleetEvent) {
	lines := bufio.NewScanner(out)
	for lines.Scan() {
		f := strings.Fields(lines.Text())
		if len(f) == 0 {
			continue
		}
		e := fleetEvent{kind: f[0]}
		switch {
		case e.kind == "S" && len(f) == 3:
			e.at, _ = strconv.ParseInt(f[1], 10, 64)
			e.tenant = f[2]
		case e.kind == "T" && len(f) == 4:
			e.id = f[1]
			e.n, _ = strconv.ParseInt(f[2], 10, 64)
			e.sent = f[3] == "1"
		case e.kind == "R" && len(f) == 5:
			e.n, _ = strconv.ParseInt(f[1], 10, 64)
			e.pings, _ = strconv.ParseInt(f[2], 10, 64)
			e.back, _ = strconv.ParseInt(f[3], 10, 64)
			e.reg, _ = strconv.ParseInt(f[4], 10, 64)
		}
		events <- e
	}
}

// next returns the next event, or an error after d without one.
func next(events <-chan fleetEvent, d time.Duration) (fleetEvent, error) {
	select {
	case e := <-events:
		return e, nil
	case <-time.After(d):
		return fleetEvent{}, errors.New("no word from the workers for " + d.String())
	}
}
