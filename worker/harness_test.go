package worker_test

import (
	"context"
	"encoding/json"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/worker"
)

// fleet is a few asynq servers sharing one Redis and one queue of their
// own, as separate machines would.
type fleet struct {
	tg        *redistest.Target
	queue     string
	client    *asynq.Client
	inspector *asynq.Inspector
	servers   []*asynq.Server
}

// newFleet starts servers asynq servers with concurrency workers each,
// every one with its own connection pool, the throttler's middleware and
// configuration, running handler.
func newFleet(t *testing.T, tg *redistest.Target, servers, concurrency int, th *worker.Throttler, handler asynq.Handler) *fleet {
	t.Helper()
	f := &fleet{
		tg:        tg,
		queue:     "q-" + tg.Prefix[len(tg.Prefix)-9:len(tg.Prefix)-1],
		client:    asynq.NewClientFromRedisClient(tg.NewClient(t)),
		inspector: asynq.NewInspectorFromRedisClient(tg.NewClient(t)),
	}
	t.Cleanup(func() { _ = f.inspector.DeleteQueue(f.queue, true) })
	for range servers {
		f.addServer(t, concurrency, th, handler)
	}
	return f
}

func (f *fleet) addServer(t *testing.T, concurrency int, th *worker.Throttler, handler asynq.Handler) *asynq.Server {
	t.Helper()
	cfg := asynq.Config{
		Concurrency:     concurrency,
		Queues:          map[string]int{f.queue: 1},
		LogLevel:        asynq.FatalLevel,
		ShutdownTimeout: 3 * time.Second,
	}
	th.Configure(&cfg)
	srv := asynq.NewServerFromRedisClient(f.tg.NewClient(t), cfg)
	// Registered after the client's clean-up, so it runs first: asynq's
	// subscriber crashes on a client closed under a running server.
	t.Cleanup(srv.Shutdown)
	if err := srv.Start(th.Middleware(handler)); err != nil {
		t.Fatal(err)
	}
	f.servers = append(f.servers, srv)
	return srv
}

// enqueue adds a task of the given type and JSON payload to the fleet's
// queue and returns its ID.
func (f *fleet) enqueue(t *testing.T, typ string, payload any, opts ...asynq.Option) string {
	t.Helper()
	body, err := json.Marshal(payload)
	if err != nil {
		t.Fatal(err)
	}
	info, err := f.client.Enqueue(asynq.NewTask(typ, body), append([]asynq.Option{asynq.Queue(f.queue)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return info.ID
}

// waitDone waits until the queue holds no pending, active, scheduled or
// retrying task and the log has want runs, and fails the test after
// timeout.
func (f *fleet) waitDone(t *testing.T, log *runLog, want int, timeout time.Duration) asynq.QueueInfo {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		info, err := f.inspector.GetQueueInfo(f.queue)
		if err == nil && log.count() >= want && info.Pending+info.Active+info.Scheduled+info.Retry == 0 {
			return *info
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %d of %d runs; queue %+v (%v)", timeout, log.count(), want, info, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// runLog records every run of a handler: which task, of which key, when.
type runLog struct {
	mu   sync.Mutex
	runs []run
}

type run struct {
	id  string // the task's original ID
	key string
	at  time.Time
}

func (l *runLog) add(id, key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.runs = append(l.runs, run{id, key, time.Now()})
}

func (l *runLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.runs)
}

// snapshot returns the runs in time order.
func (l *runLog) snapshot() []run {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := append([]run(nil), l.runs...)
	sort.Slice(out, func(i, j int) bool { return out[i].at.Before(out[j].at) })
	return out
}

// handler returns an asynq handler that logs each run under the payload's
// "tenant" field and then works for d.
func (l *runLog) handler(d time.Duration) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		var p struct{ Tenant string }
		_ = json.Unmarshal(task.Payload(), &p)
		l.add(worker.OriginalTaskID(ctx, task), p.Tenant)
		time.Sleep(d)
		return nil
	})
}

// checkOnce fails the test unless every id ran exactly once.
func checkOnce(t *testing.T, runs []run, ids []string) {
	t.Helper()
	seen := map[string]int{}
	for _, r := range runs {
		seen[r.id]++
	}
	for _, id := range ids {
		if seen[id] != 1 {
			t.Errorf("task %s ran %d times", id, seen[id])
		}
	}
	if len(runs) != len(ids) {
		t.Errorf("%d runs for %d tasks", len(runs), len(ids))
	}
}

// mostInAnyWindow returns the most runs that started within any closed
// window of length w.
func mostInAnyWindow(runs []run, w time.Duration) int {
	most := 0
	for i := range runs {
		j := i
		for j < len(runs) && runs[j].at.Sub(runs[i].at) <= w {
			j++
		}
		most = max(most, j-i)
	}
	return most
}

// events counts the throttler's events by kind.
type events struct {
	mu     sync.Mutex
	byKind map[worker.EventKind]int
	all    []worker.Event
}

func (e *events) Observe(ev worker.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.byKind == nil {
		e.byKind = map[worker.EventKind]int{}
	}
	e.byKind[ev.Kind]++
	e.all = append(e.all, ev)
}

func (e *events) count(k worker.EventKind) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.byKind[k]
}
