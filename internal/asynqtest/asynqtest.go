// Package asynqtest runs real asynq servers for tests: a small fleet on one
// Redis with a queue of its own, a log of the handler's runs, and a recorder
// of the worker's events.
package asynqtest

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
)

// Fleet is a few asynq servers sharing one Redis and one queue of their
// own, as separate machines would.
type Fleet struct {
	// Queue is the fleet's own queue, deleted when the test ends.
	Queue     string
	Client    *asynq.Client
	Inspector *asynq.Inspector
	tg        *redistest.Target
}

// NewFleet starts servers asynq servers with concurrency workers each,
// every one with its own connection pool, the throttler's middleware and
// configuration, running handler.
func NewFleet(t testing.TB, tg *redistest.Target, servers, concurrency int, th *worker.Throttler, handler asynq.Handler) *Fleet {
	t.Helper()
	f := &Fleet{
		tg:        tg,
		Queue:     "q-" + tg.Prefix[len(tg.Prefix)-9:len(tg.Prefix)-1],
		Client:    asynq.NewClientFromRedisClient(tg.NewClient(t)),
		Inspector: asynq.NewInspectorFromRedisClient(tg.NewClient(t)),
	}
	t.Cleanup(func() { _ = f.Inspector.DeleteQueue(f.Queue, true) })
	for range servers {
		f.AddServer(t, concurrency, th, handler)
	}
	return f
}

// AddServer starts one more server of the fleet.
func (f *Fleet) AddServer(t testing.TB, concurrency int, th *worker.Throttler, handler asynq.Handler) *asynq.Server {
	t.Helper()
	cfg := asynq.Config{
		Concurrency:     concurrency,
		Queues:          map[string]int{f.Queue: 1},
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
	return srv
}

// Enqueue adds a task of the given type and JSON payload to the fleet's
// queue and returns its ID.
func (f *Fleet) Enqueue(t testing.TB, typ string, payload any, opts ...asynq.Option) string {
	t.Helper()
	body, err := json.Marshal(payload)
	if err != nil {
		t.Fatal(err)
	}
	info, err := f.Client.Enqueue(asynq.NewTask(typ, body), append([]asynq.Option{asynq.Queue(f.Queue)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return info.ID
}

// WaitDone waits until the queue holds no pending, active, scheduled or
// retrying task and the log has want runs, and fails the test after
// timeout.
func (f *Fleet) WaitDone(t testing.TB, log *RunLog, want int, timeout time.Duration) asynq.QueueInfo {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		info, err := f.Inspector.GetQueueInfo(f.Queue)
		if err == nil && log.Count() >= want && info.Pending+info.Active+info.Scheduled+info.Retry == 0 {
			return *info
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %d of %d runs; queue %+v (%v)", timeout, log.Count(), want, info, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// RunLog records every run of a handler: which task, of which key, when.
type RunLog struct {
	mu   sync.Mutex
	runs []Run
}

// Run is one run of a handler.
type Run struct {
	ID     string // the task's original ID (see worker.OriginalTaskID)
	Key    string
	At     time.Time // when the handler started, on this process's clock
	TaskID string    // asynq's ID of the message run (a hand-over copy's own)
}

// Add records a run of the task id under key, now.
func (l *RunLog) Add(id, key string) { l.AddRun(Run{ID: id, Key: key}) }

// AddRun records r, at now unless r.At is set.
func (l *RunLog) AddRun(r Run) {
	if r.At.IsZero() {
		r.At = time.Now()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.runs = append(l.runs, r)
}

// Count returns how many runs were recorded.
func (l *RunLog) Count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.runs)
}

// Snapshot returns the runs in time order.
func (l *RunLog) Snapshot() []Run {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := append([]Run(nil), l.runs...)
	sort.Slice(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out
}

// Handler returns an asynq handler that logs each run under the payload's
// "tenant" field and then works for d.
func (l *RunLog) Handler(d time.Duration) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		var p struct{ Tenant string }
		_ = json.Unmarshal(task.Payload(), &p)
		id, _ := asynq.GetTaskID(ctx)
		l.AddRun(Run{ID: worker.OriginalTaskID(ctx, task), Key: p.Tenant, TaskID: id})
		time.Sleep(d)
		return nil
	})
}

// CheckOnce fails the test unless every id ran exactly once.
func CheckOnce(t testing.TB, runs []Run, ids []string) {
	t.Helper()
	seen := map[string]int{}
	for _, r := range runs {
		seen[r.ID]++
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

// MostInAnyWindow returns the most runs that started within any closed
// window of length w.
func MostInAnyWindow(runs []Run, w time.Duration) int {
	most := 0
	for i := range runs {
		j := i
		for j < len(runs) && runs[j].At.Sub(runs[i].At) <= w {
			j++
		}
		most = max(most, j-i)
	}
	return most
}

// Events counts the throttler's events by kind.
type Events struct {
	mu     sync.Mutex
	byKind map[worker.EventKind]int
	all    []worker.Event
}

// ByKind returns the counts of the events seen so far.
func (e *Events) ByKind() map[worker.EventKind]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.byKind)
}

// All returns the events seen so far.
func (e *Events) All() []worker.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.all)
}

// Observe records an event; Events is a worker.Observer.
func (e *Events) Observe(_ context.Context, ev worker.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.byKind == nil {
		e.byKind = map[worker.EventKind]int{}
	}
	e.byKind[ev.Kind]++
	e.all = append(e.all, ev)
}

// Count returns how many events of kind k were seen.
func (e *Events) Count(k worker.EventKind) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.byKind[k]
}

// NewLimiter returns a limiter of policy on a connection pool of its own to
// the target, under the target's key prefix.
func NewLimiter(t testing.TB, tg *redistest.Target, p throttle.Policy) *throttle.Limiter {
	t.Helper()
	l, err := throttle.New(tg.NewClient(t), "l", p, throttle.WithPrefix(tg.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// NewThrottler returns a Throttler of rules on the target, under its key
// prefix.
func NewThrottler(t testing.TB, tg *redistest.Target, rules []worker.Rule, opts ...worker.Option) *worker.Throttler {
	t.Helper()
	th, err := worker.New(tg.Client, rules, append([]worker.Option{worker.WithPrefix(tg.Prefix)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return th
}
