package worker_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
	"github.com/redis/go-redis/v9"
)

// TestMain runs the test binary as a child asynq server when asked to: a
// server that the concurrency test kills mid-task.
func TestMain(m *testing.M) {
	if os.Getenv("JT_CHILD_QUEUE") != "" {
		runChildServer()
		return
	}
	os.Exit(m.Run())
}

// TestConcurrencyCapAcrossServers: a concurrency rule with Limit 3 across
// two servers of 10 workers: the handler never sees more than 3 running.
func TestConcurrencyCapAcrossServers(t *testing.T) {
	tg := redistest.New(t)
	limiter, err := throttle.NewConcurrencyLimiter(tg.NewClient(t), "limiter", throttle.Concurrency{Limit: 3, Lease: 5 * time.Second}, throttle.WithPrefix(tg.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	var events asynqtest.Events
	var held, mostHeld atomic.Int32
	gauge := worker.ObserverFunc(func(ctx context.Context, e worker.Event) {
		events.Observe(ctx, e)
		switch e.Kind {
		case worker.LeaseTaken:
			now := held.Add(1)
			for m := mostHeld.Load(); now > m && !mostHeld.CompareAndSwap(m, now); m = mostHeld.Load() {
			}
		case worker.LeaseReleased:
			held.Add(-1)
		}
	})
	th := asynqtest.NewThrottler(t, tg, []worker.Rule{worker.Concurrency("exports", worker.Type("export"), limiter, worker.KeyBy(worker.ByType()))}, worker.WithObserver(gauge))
	var running, most atomic.Int32
	var log asynqtest.RunLog
	handler := asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		now := running.Add(1)
		defer running.Add(-1)
		for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
		}
		log.Add(worker.OriginalTaskID(ctx, task), "")
		time.Sleep(time.Duration(30+rand.IntN(50)) * time.Millisecond)
		return nil
	})
	f := asynqtest.NewFleet(t, tg, 2, 10, th, handler)
	var ids []string
	for i := range 40 {
		ids = append(ids, f.Enqueue(t, "export", map[string]int{"n": i}))
	}
	info := f.WaitDone(t, &log, 40, 60*time.Second)
	asynqtest.CheckOnce(t, log.Snapshot(), ids)
	if most.Load() != 3 {
		t.Fatalf("at most %d tasks ran at once; want the cap of 3 reached and never passed", most.Load())
	}
	if info.Archived != 0 || info.Failed != 0 {
		t.Fatalf("%d archived, %d failed", info.Archived, info.Failed)
	}
	if r, err := limiter.Peek(context.Background(), "export"); err != nil || r.Remaining != 3 {
		t.Fatalf("after the run: %+v, %v; every lease should be released", r, err)
	}
	// The lease events keep an exact gauge: 40 taken, 40 released, never
	// more than the cap held.
	if taken, released := events.Count(worker.LeaseTaken), events.Count(worker.LeaseReleased); taken != 40 || released != 40 || held.Load() != 0 || mostHeld.Load() > 3 {
		t.Fatalf("lease events: %d taken, %d released, %d held at the end, %d at most; want 40, 40, 0, ≤3",
			taken, released, held.Load(), mostHeld.Load())
	}
}

// TestKilledServerFreesItsSlot: a server process killed (SIGKILL) while its
// task holds the only slot frees the slot within the lease, and another
// server's task then runs.
func TestKilledServerFreesItsSlot(t *testing.T) {
	tg := redistest.New(t)
	policy := throttle.Concurrency{Limit: 1, Lease: 2 * time.Second}
	limiter, err := throttle.NewConcurrencyLimiter(tg.NewClient(t), "limiter", policy, throttle.WithPrefix(tg.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	th := asynqtest.NewThrottler(t, tg, []worker.Rule{worker.Concurrency("gate", worker.AnyTask(), limiter, worker.KeyBy(worker.Constant("gate")))})
	var log asynqtest.RunLog
	f := asynqtest.NewFleet(t, tg, 0, 0, th, nil)

	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), "JT_CHILD_QUEUE="+f.Queue, "JT_CHILD_PREFIX="+tg.Prefix,
		"JT_CHILD_LEASE="+policy.Lease.String(), "JT_CHILD_REDIS="+childRedis(tg))
	child.Stdout, child.Stderr = os.Stderr, os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	f.Enqueue(t, "block", nil)
	deadline := time.Now().Add(20 * time.Second)
	for tg.Client.Exists(context.Background(), tg.Prefix+"child-running").Val() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the child server never started its task")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if r, _ := limiter.Peek(context.Background(), "gate"); r.Remaining != 0 {
		t.Fatalf("the child's task does not hold the slot: %+v", r)
	}
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	_ = child.Wait()
	for {
		r, err := limiter.Peek(context.Background(), "gate")
		if err != nil {
			t.Fatal(err)
		}
		if r.Remaining == 1 {
			break
		}
		if time.Since(killed) > 10*time.Second {
			t.Fatal("the killed server's slot was still held after 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	freed := time.Since(killed)
	if bound := policy.Lease + policy.Lease/3; freed > bound {
		t.Fatalf("slot freed %s after the kill; the lease bounds it at %s", freed, bound)
	}
	// Another server's task now gets the slot.
	f.AddServer(t, 2, th, asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		if task.Type() == "probe" {
			log.Add(worker.OriginalTaskID(ctx, task), "")
		}
		return nil
	}))
	probe := f.Enqueue(t, "probe", nil)
	deadline = time.Now().Add(20 * time.Second)
	for log.Count() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("a task of another server never got the freed slot")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if runs := log.Snapshot(); runs[0].ID != probe {
		t.Fatalf("ran %s, want the probe %s", runs[0].ID, probe)
	}
	t.Logf("slot freed %s after SIGKILL (lease %s)", freed, policy.Lease)
}

// childRedis tells the child server where Redis is.
func childRedis(tg *redistest.Target) string {
	switch {
	case tg.Mini != nil:
		return tg.Mini.Addr()
	case os.Getenv("REDIS_CLUSTER_ADDRS") != "":
		return "cluster:" + os.Getenv("REDIS_CLUSTER_ADDRS")
	}
	return os.Getenv("REDIS_ADDR")
}

// runChildServer is the killed server of TestKilledServerFreesItsSlot: one
// asynq server whose task marks that it runs and then never returns.
func runChildServer() {
	var rdb redis.UniversalClient
	if addrs, ok := strings.CutPrefix(os.Getenv("JT_CHILD_REDIS"), "cluster:"); ok {
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(addrs, ",")})
	} else {
		rdb = redis.NewClient(&redis.Options{Addr: os.Getenv("JT_CHILD_REDIS")})
	}
	prefix := os.Getenv("JT_CHILD_PREFIX")
	lease, _ := time.ParseDuration(os.Getenv("JT_CHILD_LEASE"))
	limiter, err := throttle.NewConcurrencyLimiter(rdb, "limiter", throttle.Concurrency{Limit: 1, Lease: lease}, throttle.WithPrefix(prefix))
	if err != nil {
		panic(err)
	}
	th, err := worker.New(rdb, []worker.Rule{worker.Concurrency("gate", worker.AnyTask(), limiter, worker.KeyBy(worker.Constant("gate")))}, worker.WithPrefix(prefix))
	if err != nil {
		panic(err)
	}
	cfg := asynq.Config{Concurrency: 1, Queues: map[string]int{os.Getenv("JT_CHILD_QUEUE"): 1}, LogLevel: asynq.FatalLevel}
	th.Configure(&cfg)
	srv := asynq.NewServerFromRedisClient(rdb, cfg)
	err = srv.Run(th.Middleware(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		rdb.Set(ctx, prefix+"child-running", 1, time.Minute)
		select {} // killed here
	})))
	fmt.Fprintln(os.Stderr, "child server:", err)
	os.Exit(1)
}
