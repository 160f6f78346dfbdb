package scheduler_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/scheduler"
	"github.com/redis/go-redis/v9"

	_ "time/tzdata" // Asia/Kolkata on a machine without a zoneinfo database
)

// slowBatch is a producer of five tasks emitted one by one, each only when
// the test lets it (gate), like a producer paging through a partner's API.
// It records which replica produced what.
type slowBatch struct {
	mu      sync.Mutex
	runs    []string // the replica of each run, in order
	emitted map[string]int
	ticks   []time.Time
	gate    chan struct{} // one receive per emit; closed: emit freely
}

func newSlowBatch() *slowBatch {
	return &slowBatch{emitted: map[string]int{}, gate: make(chan struct{})}
}

func (b *slowBatch) producer(replica string) scheduler.Producer {
	return scheduler.Stream(func(ctx context.Context, emit func(*asynq.Task) error) error {
		tick, _ := scheduler.TickTime(ctx)
		b.mu.Lock()
		b.runs = append(b.runs, replica)
		b.ticks = append(b.ticks, tick)
		b.mu.Unlock()
		for i := range 5 {
			select {
			case <-b.gate:
			case <-ctx.Done():
				return ctx.Err()
			}
			// The batch is derived from the tick, so every run emits the
			// same tasks in the same order.
			if err := emit(asynq.NewTask("sync", fmt.Appendf(nil, "%s/%d", tick.UTC().Format(time.RFC3339), i))); err != nil {
				return err
			}
			b.mu.Lock()
			b.emitted[replica]++
			b.mu.Unlock()
		}
		return nil
	})
}

func (b *slowBatch) snapshot() (runs []string, emitted map[string]int, ticks []time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[string]int{}
	for k, v := range b.emitted {
		out[k] = v
	}
	return slices.Clone(b.runs), out, slices.Clone(b.ticks)
}

// checkBatchOnce fails the test unless the queue holds the tick's five
// tasks, each once.
func checkBatchOnce(t *testing.T, inspector *asynq.Inspector, queue, entry string, tick time.Time) {
	t.Helper()
	var ids []string
	for _, info := range tasksIn(t, inspector, queue) {
		ids = append(ids, info.ID)
	}
	slices.Sort(ids)
	var want []string
	for i := range 5 {
		want = append(want, fmt.Sprintf("%s@%s:%09d", entry, tick.UTC().Format(time.RFC3339Nano), i))
	}
	if !slices.Equal(ids, want) {
		t.Fatalf("tasks in the queue: %v; want the tick's five, once each: %v", ids, want)
	}
}

// TestAStoppedTicksBatchIsFinishedElsewhere: a replica stopped gracefully
// while its producer is halfway through a tick's batch releases the tick,
// and another replica produces it again, to its end, within one look for
// lapsed ticks: every task of the batch is enqueued once. Before, the tick
// was marked done and kept 2 of its 5 tasks.
func TestAStoppedTicksBatchIsFinishedElsewhere(t *testing.T) {
	tg := redistest.New(t)
	queue, inspector := queueOf(t, tg)
	batch := newSlowBatch()
	replicas := map[string]*scheduler.Scheduler{}
	for _, name := range []string{"a", "b"} {
		s, err := scheduler.New(tg.NewClient(t), scheduler.WithPrefix(tg.Prefix), quiet)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Add("nightly", "@every 1h", batch.producer(name), scheduler.TaskOptions(asynq.Queue(queue))); err != nil {
			t.Fatal(err)
		}
		replicas[name] = s
	}
	hour := time.Now().Truncate(time.Hour).Add(time.Hour)
	clock := newFakeClock(t, nil, hour.Add(-time.Second), replicas["a"], replicas["b"])
	for _, s := range replicas {
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "both replicas waiting", func() bool { return clock.Waiting() == 4 })
	clock.Advance(time.Second)
	batch.gate <- struct{}{}
	batch.gate <- struct{}{}
	eventually(t, "two tasks emitted", func() bool {
		_, emitted, _ := batch.snapshot()
		return emitted["a"]+emitted["b"] == 2
	})
	runs, _, _ := batch.snapshot()
	first := runs[0]
	other := map[string]string{"a": "b", "b": "a"}[first]
	if err := replicas[first].Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	close(batch.gate) // from now on the producer emits freely
	clock.Advance(scheduler.RecoverEvery)
	eventually(t, "the batch finished by the other replica", func() bool {
		_, emitted, _ := batch.snapshot()
		return emitted[other] == 5
	})
	if err := replicas[other].Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	runs, emitted, ticks := batch.snapshot()
	if !slices.Equal(runs, []string{first, other}) || emitted[first] != 2 || emitted[other] != 5 {
		t.Fatalf("runs %v, emitted %v; want %s stopped after 2 and %s producing all 5", runs, emitted, first, other)
	}
	for _, tick := range ticks {
		if !tick.Equal(hour) {
			t.Fatalf("the producers ran for ticks %v; want %s each time", ticks, hour)
		}
	}
	checkBatchOnce(t, inspector, queue, "nightly", hour)
}

// TestADeadReplicasTickIsTakenOver: a replica that stops answering halfway
// through a batch (it died, or lost its network) stops renewing its claim;
// the claim lapses within its lease, and another replica takes the tick
// over and finishes the batch.
func TestADeadReplicasTickIsTakenOver(t *testing.T) {
	tg := redistest.Embedded(t) // the claims' leases run on a Redis clock the test drives
	queue, inspector := queueOf(t, tg)
	redistest.QuietRedisLog()
	batch := newSlowBatch()
	replicas := map[string]*scheduler.Scheduler{}
	proxies := map[string]*redistest.Proxy{}
	for _, name := range []string{"a", "b"} {
		proxies[name] = redistest.NewProxy(t, tg.Mini.Addr())
		client := redis.NewClient(&redis.Options{Addr: proxies[name].Addr(), MaxRetries: -1})
		t.Cleanup(func() { client.Close() })
		s, err := scheduler.New(client, scheduler.WithPrefix(tg.Prefix), quiet)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Add("nightly", "@every 1h", batch.producer(name), scheduler.TaskOptions(asynq.Queue(queue))); err != nil {
			t.Fatal(err)
		}
		replicas[name] = s
	}
	hour := redistest.Start.Truncate(time.Hour).Add(time.Hour)
	clock := newFakeClock(t, tg, hour.Add(-time.Second), replicas["a"], replicas["b"])
	for _, s := range replicas {
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "both replicas waiting", func() bool { return clock.Waiting() == 4 })
	clock.Advance(time.Second)
	batch.gate <- struct{}{}
	eventually(t, "a task emitted", func() bool {
		_, emitted, _ := batch.snapshot()
		return emitted["a"]+emitted["b"] == 1
	})
	runs, _, _ := batch.snapshot()
	dead := runs[0]
	other := map[string]string{"a": "b", "b": "a"}[dead]
	proxies[dead].Pause() // it can no longer reach Redis: its claim is not renewed
	close(batch.gate)
	// The claim lapses after its lease; the other replica's next look
	// takes the tick over.
	clock.Advance(scheduler.ClaimLease)
	clock.Advance(scheduler.RecoverEvery)
	eventually(t, "the batch finished by the other replica", func() bool {
		_, emitted, _ := batch.snapshot()
		return emitted[other] == 5
	})
	runs, emitted, _ := batch.snapshot()
	if len(runs) != 2 || runs[1] != other || emitted[other] != 5 {
		t.Fatalf("runs %v, emitted %v; want %s taking the tick over and producing all 5", runs, emitted, other)
	}
	checkBatchOnce(t, inspector, queue, "nightly", hour)
	proxies[dead].Resume()
	for _, s := range replicas {
		if err := s.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// schedulerBehindProxy returns a scheduler on an embedded Redis reached
// through a proxy the test can pause (calls then time out in 200 ms), with
// an entry "nightly" every hour producing batch, the failures it reports,
// and the fake clock, an hour's start a second away, once it waits for the
// tick.
func schedulerBehindProxy(t *testing.T, tg *redistest.Target, batch func(context.Context) ([]*asynq.Task, error), opts ...scheduler.BatchOption) (*scheduler.Scheduler, *redistest.Proxy, *reported, *fakeClock, time.Time) {
	t.Helper()
	redistest.QuietRedisLog()
	proxy := redistest.NewProxy(t, tg.Mini.Addr())
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: -1, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { client.Close() })
	failures := &reported{}
	s, err := scheduler.New(client, scheduler.WithPrefix(tg.Prefix), quiet, failures.option())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Add("nightly", "@every 1h", scheduler.Batch(batch), opts...); err != nil {
		t.Fatal(err)
	}
	hour := redistest.Start.Truncate(time.Hour).Add(time.Hour)
	clock := newFakeClock(t, tg, hour.Add(-time.Second), s)
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the entry waiting", func() bool { return clock.Waiting() == 2 })
	return s, proxy, failures, clock, hour
}

// TestATickThatCameWhileRedisWasAwayIsProducedOnItsReturn: a replica that
// cannot reach Redis at a tick reports it, asks for the tick's claim again
// every look, and produces the tick once Redis is back. (The tick was
// lost: nothing had recorded it.)
func TestATickThatCameWhileRedisWasAwayIsProducedOnItsReturn(t *testing.T) {
	tg := redistest.Embedded(t)
	queue, inspector := queueOf(t, tg)
	s, proxy, failures, clock, hour := schedulerBehindProxy(t, tg, func(context.Context) ([]*asynq.Task, error) {
		return []*asynq.Task{asynq.NewTask("sync", nil)}, nil
	}, scheduler.TaskOptions(asynq.Queue(queue)))
	proxy.Pause()
	clock.Advance(time.Second)
	eventually(t, "the failed claim reported", func() bool { return len(failures.all()) == 1 })
	eventually(t, "the claim to be asked again", func() bool { return clock.Waiting() == 3 })
	proxy.DropConnections()
	proxy.Resume()
	clock.Advance(scheduler.RecoverEvery)
	eventually(t, "the tick produced", func() bool { return len(tasksIn(t, inspector, queue)) == 1 })
	if err := s.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if tasks := tasksIn(t, inspector, queue); len(tasks) != 1 || tasks[0].ID != "nightly@"+hour.UTC().Format(time.RFC3339)+":000000000" {
		t.Fatalf("tasks %v; want the tick's one task", tasks)
	}
	if got := failures.all(); len(got) != 1 || !strings.Contains(got[0].Error(), "claiming the tick") {
		t.Fatalf("failures %v; want the one failed claim", got)
	}
}

// TestAFailureToMarkATickDoneIsReported: a tick whose producer ended but
// whose claim Redis would not mark done is reported, not passed over in
// silence (another replica will produce it again).
func TestAFailureToMarkATickDoneIsReported(t *testing.T) {
	tg := redistest.Embedded(t)
	boom := errors.New("partner API down")
	var proxy *redistest.Proxy
	s, proxy, failures, clock, _ := schedulerBehindProxy(t, tg, func(context.Context) ([]*asynq.Task, error) {
		proxy.Pause() // Redis goes as the producer ends
		return nil, boom
	})
	clock.Advance(time.Second)
	eventually(t, "both failures reported", func() bool { return len(failures.all()) == 2 })
	proxy.DropConnections()
	proxy.Resume()
	if err := s.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := failures.all()
	if !errors.Is(got[0], boom) || !strings.Contains(got[1].Error(), "marking the tick done") {
		t.Fatalf("failures %v; want the producer's, then the failure to mark the tick done", got)
	}
}

// TestTicksAreUTCByDefault: a spec without CRON_TZ= ticks in UTC whatever
// the machine's time zone, so that replicas on machines set to different
// zones agree on every tick. The zone is the process's, so the test runs
// itself again in a process whose TZ is Asia/Kolkata (UTC+5:30).
func TestTicksAreUTCByDefault(t *testing.T) {
	if os.Getenv("JOBTHROTTLE_TZ_CHILD") == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestTicksAreUTCByDefault$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), "JOBTHROTTLE_TZ_CHILD=1", "TZ=Asia/Kolkata",
			"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0")) // no second's sleep at a -race binary's exit
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "ticked at 02:00 UTC") {
			t.Fatalf("the test in a process at UTC+5:30: %v\n%s", err, out)
		}
		return
	}
	if _, offset := time.Now().Zone(); offset != 5*3600+1800 {
		t.Fatalf("TZ=Asia/Kolkata gave a zone %d s from UTC", offset)
	}
	tg := redistest.New(t)
	s, err := scheduler.New(tg.Client, scheduler.WithPrefix(tg.Prefix), quiet)
	if err != nil {
		t.Fatal(err)
	}
	ticks := make(chan time.Time, 4)
	err = s.Add("nightly", "0 2 * * *", scheduler.Batch(func(ctx context.Context) ([]*asynq.Task, error) {
		tick, _ := scheduler.TickTime(ctx)
		ticks <- tick
		return nil, nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	day := time.Now().UTC().Truncate(24*time.Hour).AddDate(0, 0, 1)
	clock := newFakeClock(t, nil, day.Add(2*time.Hour-time.Second), s)
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Stop(context.Background())
	eventually(t, "the entry waiting", func() bool { return clock.Waiting() == 2 })
	clock.Advance(time.Second)
	select {
	case tick := <-ticks:
		if want := day.Add(2 * time.Hour); !tick.Equal(want) {
			t.Fatalf("\"0 2 * * *\" ticked at %s; want %s (02:00 UTC)", tick, want)
		}
		t.Logf("\"0 2 * * *\" ticked at 02:00 UTC, the machine's zone at UTC+5:30")
	case <-time.After(10 * time.Second):
		t.Fatal("\"0 2 * * *\" did not tick at 02:00 UTC with the machine's zone at UTC+5:30")
	}
}

// TestFinishedTicksAreForgotten: an entry ticking every second keeps one
// key of finished ticks, whose members expire after ten minutes, not one
// key per tick for a day; every key the scheduler writes has an expiry.
func TestFinishedTicksAreForgotten(t *testing.T) {
	tg := redistest.Embedded(t)
	var mu sync.Mutex
	var failures []error
	s, err := scheduler.New(tg.Client, scheduler.WithPrefix(tg.Prefix), quiet, scheduler.WithErrorHandler(func(e *scheduler.EntryError) {
		mu.Lock()
		failures = append(failures, e)
		mu.Unlock()
	}))
	if err != nil {
		t.Fatal(err)
	}
	produced := 0
	err = s.Add("heartbeat", "@every 1s", scheduler.Batch(func(context.Context) ([]*asynq.Task, error) {
		mu.Lock()
		produced++
		mu.Unlock()
		return nil, nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	clock := newFakeClock(t, tg, redistest.Start.Truncate(time.Second), s)
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Stop(context.Background())
	eventually(t, "the entry waiting", func() bool { return clock.Waiting() == 2 })
	const ticks = 720 // twelve minutes
	for i := 1; i <= ticks; i++ {
		clock.Advance(time.Second)
		eventually(t, fmt.Sprintf("tick %d finished", i), func() bool {
			mu.Lock()
			defer mu.Unlock()
			if len(failures) > 0 {
				t.Fatalf("tick %d: %v", i, failures)
			}
			if produced < i {
				return false
			}
			n := 0
			for _, key := range tg.Keys(t) {
				if strings.HasSuffix(key, ":done") {
					members, _ := tg.Mini.ZMembers(key)
					n = len(members)
				}
			}
			return n >= min(i, 600)
		})
	}
	keys := tg.Keys(t)
	if len(keys) > 2 {
		t.Fatalf("%d keys after %d ticks: %v; want the entry's two", len(keys), ticks, keys)
	}
	for _, key := range keys {
		if ttl := tg.Mini.TTL(key); ttl <= 0 {
			t.Errorf("key %s has no expiry", key)
		}
		if strings.HasSuffix(key, ":done") {
			members, _ := tg.Mini.ZMembers(key)
			if len(members) > 601 {
				t.Errorf("%d finished ticks remembered after %d ticks; want those of the last ten minutes", len(members), ticks)
			}
			t.Logf("figures: after %d ticks of @every 1s: %d keys, %d finished ticks remembered", ticks, len(keys), len(members))
		}
	}
}
