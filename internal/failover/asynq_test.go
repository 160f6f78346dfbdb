//go:build failover

package failover

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
	"github.com/redis/go-redis/v9"
)

// fleet is a few asynq servers, each a process of its own: one client per
// server, shared by its asynq server, its limiter and its Throttler, as
// the README builds one.
type fleet struct {
	queue     string
	client    *asynq.Client
	inspector *asynq.Inspector
	log       asynqtest.RunLog
}

const (
	fleetServers = 2
	fleetTenants = 4
	fleetPerTask = 5 * time.Millisecond
	tenantRate   = 20 // tasks per second per tenant
)

func startFleet(t *testing.T, tg *redistest.Target) *fleet {
	t.Helper()
	f := &fleet{
		queue:     "q" + strings.NewReplacer(":", "", "/", "").Replace(tg.Prefix[len(tg.Prefix)-9:]),
		client:    asynq.NewClientFromRedisClient(tg.NewClient(t)),
		inspector: asynq.NewInspectorFromRedisClient(tg.NewClient(t)),
	}
	t.Cleanup(func() { _ = f.inspector.DeleteQueue(f.queue, true) })
	for range fleetServers {
		client := tg.NewClient(t)
		limiter, err := throttle.New(client, "tenant", throttle.GCRA{Rate: throttle.PerSecond(tenantRate), Burst: 1},
			throttle.WithPrefix(tg.Prefix), throttle.WithTimeout(time.Second), throttle.WithLogger(nil))
		if err != nil {
			t.Fatal(err)
		}
		th, err := worker.New(client, []worker.Rule{
			worker.Rate("tenant", worker.Type("sync"), limiter, worker.KeyBy(worker.ByPayloadField("tenant"))),
		}, worker.WithPrefix(tg.Prefix), worker.WithLogger(nil))
		if err != nil {
			t.Fatal(err)
		}
		srv := th.NewServer(asynq.Config{
			Concurrency:     10,
			Queues:          map[string]int{f.queue: 1},
			LogLevel:        asynq.FatalLevel,
			ShutdownTimeout: 3 * time.Second,
			RetryDelayFunc:  func(int, error, *asynq.Task) time.Duration { return recoveryDelay },
		})
		t.Cleanup(srv.Shutdown)
		if err := srv.Start(th.Middleware(f.log.Handler(fleetPerTask))); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// enqueue adds n tasks spread over the tenants and returns their IDs.
func (f *fleet) enqueue(t *testing.T, n int) []string {
	t.Helper()
	var ids []string
	for i := range n {
		body := fmt.Sprintf(`{"tenant":"t%d"}`, i%fleetTenants)
		info, err := f.client.Enqueue(asynq.NewTask("sync", []byte(body)), asynq.Queue(f.queue), asynq.MaxRetry(3),
			asynq.Retention(time.Hour)) // kept when done, so retried counts can be read
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, info.ID)
	}
	return ids
}

// replicated waits until replica has every write master had when called.
func replicated(t testing.TB, master, replica *node) {
	t.Helper()
	offset := func(n *node, field string) int64 {
		info, _ := n.do(t, "INFO", "replication").Text()
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, field+":"); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
		return -1
	}
	want := offset(master, "master_repl_offset")
	waitUntil(t, 10*time.Second, "the replica did not catch up", func() bool {
		return offset(replica, "slave_repl_offset") >= want
	})
}

// pauseWithin is the longest the asynq fleet may go without starting a
// task after its queue's master fails: a promotion (about 2.5 s with a node
// timeout of 1 s) plus asynq's own back-off after a failed dequeue. Measured
// 2.2-2.8 s. Without a client that reloads its slot map, a Cluster's fleet
// waits for go-redis's own reload, 60 s by default, or for the old master.
const pauseWithin = 10 * time.Second

// frozenReadTimeout is the cluster clients' ReadTimeout when a master
// freezes. asynq's own calls to a frozen master wait for the client's read
// timeout, retried (go-redis's defaults: 3 s, up to four times, and again
// at the Cluster's level): the fleet paused 14.9-29.8 s with the defaults
// (five runs), 5.8-5.9 s with ReadTimeout 1 s, which docs/reliability.md
// advises where a hung master must cost seconds. A killed master refuses
// connections at once, and a Sentinel client drops the old master's
// connections on the switch: both take the defaults.
const frozenReadTimeout = time.Second

// recoveredWithin bounds how long after the fault every task has run. A
// task whose run a promotion forgot is asynq's to bring back: its lease
// runs out up to 30 s after the fault, asynq's recoverer takes leases that
// ended at least 30 s before it looks, looks once a minute, and retries
// the task after the server's RetryDelayFunc (here 1 s, recoveryDelay;
// asynq's default is 15-44 s): up to about 121 s, and a margin.
const recoveredWithin = 135 * time.Second

// recoveryDelay is the fleet's retry delay for errors other than a
// throttled task's (which the Throttler times): here only a task asynq's
// recoverer brings back. asynq's default would add 15-44 s to the test.
const recoveryDelay = time.Second

// TestAsynqFleetThroughFailover: two asynq servers (each its own client,
// limiter and Throttler, a rule of 20/s per tenant) work through 240 tasks
// while the master that holds asynq's queue is killed or frozen, on a
// Cluster and behind Sentinels. Every task runs (once, or again by asynq's
// own recovery: a promotion can lose the record of a task's run), none is
// archived, and the fleet goes on within pauseWithin, with no restart.
// It runs beside TestFailover, each on servers of its own.
func TestAsynqFleetThroughFailover(t *testing.T) {
	t.Parallel() // beside TestFailover: a fleet that asynq's recovery keeps waiting for up to 2 min
	for _, topo := range []string{"cluster", "sentinel"} {
		for _, fault := range []string{"kill", "freeze"} {
			t.Run(topo+"/"+fault, func(t *testing.T) { fleetFailover(t, topo, fault) })
		}
	}
}

// fleetFailover runs TestAsynqFleetThroughFailover on one topology with
// one fault.
func fleetFailover(t *testing.T, topo, fault string) {
	var tg *redistest.Target
	var victimOf func(queue string) (master, replica *node)
	if topo == "cluster" {
		c := startCluster(t)
		tg = redistest.Connect(t, topo, func() redis.UniversalClient {
			o := &redis.ClusterOptions{Addrs: c.seeds()}
			if fault == "freeze" {
				o.ReadTimeout = frozenReadTimeout
			}
			return redis.NewClusterClient(o)
		})
		victimOf = c.masterAndReplica
	} else {
		s := startSentinels(t)
		tg = redistest.Connect(t, topo, func() redis.UniversalClient {
			return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: masterName, SentinelAddrs: s.addrs()})
		})
		victimOf = func(string) (*node, *node) { return s.master, s.replica }
	}
	f := startFleet(t, tg)
	const tasks = 240
	ids := f.enqueue(t, tasks)
	victim, replica := victimOf(f.queue)
	replicated(t, victim, replica)
	waitUntil(t, 30*time.Second, "the fleet did not start", func() bool { return f.log.Count() >= tasks/3 })
	before := f.log.Count()
	faultAt := time.Now()
	if fault == "kill" {
		victim.kill()
	} else {
		victim.freeze(t)
		defer victim.thaw(t)
	}

	ran := func() map[string]int {
		seen := map[string]int{}
		for _, r := range f.log.Snapshot() {
			seen[r.ID]++
		}
		return seen
	}
	deadline := time.Now().Add(recoveredWithin)
	for len(ran()) < tasks {
		if time.Now().After(deadline) {
			seen := ran()
			var missing []string
			for _, id := range ids {
				if seen[id] == 0 {
					state := "unknown"
					if info, err := f.inspector.GetTaskInfo(f.queue, id); err == nil {
						state = fmt.Sprintf("%s, retried %d, next at %s", info.State, info.Retried, info.NextProcessAt.Format(time.TimeOnly))
					} else {
						state = err.Error()
					}
					missing = append(missing, id+" ("+state+")")
				}
			}
			t.Fatalf("after %s: %d of %d tasks ran; not run: %s", recoveredWithin, len(seen), tasks, strings.Join(missing, "; "))
		}
		time.Sleep(50 * time.Millisecond)
	}
	done := time.Since(faultAt)
	seen := ran()
	again := 0
	for _, id := range ids {
		again += seen[id] - 1
	}
	archived, err := f.inspector.ListArchivedTasks(f.queue)
	if err != nil {
		t.Fatal(err)
	}
	if len(archived) != 0 {
		t.Errorf("%d tasks archived through the failover", len(archived))
	}
	runs := f.log.Snapshot()
	// The pause is the fleet's, between runs it could make: a message
	// asynq brought back (retried, as only its recoverer retries here) waits
	// out asynq's lease, recoverer and retry delay whatever the library
	// does, so its runs are left out.
	recovered := map[string]bool{}
	for _, r := range runs {
		if _, done := recovered[r.TaskID]; done || r.TaskID == "" {
			continue
		}
		info, err := f.inspector.GetTaskInfo(f.queue, r.TaskID)
		recovered[r.TaskID] = err == nil && info.Retried > 0
	}
	var gap time.Duration
	last := faultAt
	brought := 0
	for _, r := range runs {
		if !r.At.After(faultAt) {
			continue
		}
		if recovered[r.TaskID] {
			brought++
			continue
		}
		gap = max(gap, r.At.Sub(last))
		last = r.At
	}
	most := 0
	for tenant := range fleetTenants {
		var mine []asynqtest.Run
		for _, r := range runs {
			if r.Key == fmt.Sprintf("t%d", tenant) {
				mine = append(mine, r)
			}
		}
		most = max(most, asynqtest.MostInAnyWindow(mine, time.Second))
	}
	if gap > pauseWithin {
		t.Errorf("the fleet started no task for %s after the fault, want within %s", gap.Round(100*time.Millisecond), pauseWithin)
	}
	t.Logf("figures: %s/%s, master of the queue failed after %d of %d tasks ran: every task ran within %s of the fault; "+
		"the longest pause between runs after it %s, leaving out %d runs of messages asynq's recoverer brought back; %d runs again; %d archived; "+
		"the most runs of a tenant in 1 s %d (rule %d/s)",
		topo, fault, before, tasks, done.Round(100*time.Millisecond), gap.Round(100*time.Millisecond), brought, again, len(archived), most, tenantRate)
}
