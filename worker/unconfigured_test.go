package worker_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
)

// recordedWithin bounds each wait for asynq to take tasks and record their
// retries: asynq polls every 100 ms here and a task takes a few Redis round
// trips; measured on a 2-core machine under -race, about 0.3 s. The bound
// is a timeout for a condition, not a claim about timing.
const recordedWithin = 30 * time.Second

// TestMissingConfigureIsLoud: one Throttler serves two asynq servers, one
// built with NewServer (so configured) and one whose Config never went
// through Configure. Under a rule that admits one task per queue an hour,
// each queue gets three tasks: one runs, two are throttled. On the
// configured server they wait in the retry set with no retry used and
// nothing is reported; on the bare one asynq counts them as failed, the
// Observer sees an Unconfigured event for each, and one Error names the fix.
func TestMissingConfigureIsLoud(t *testing.T) {
	tg := redistest.New(t)
	limiter := asynqtest.NewLimiter(t, tg, throttle.FixedWindow{Limit: 1, Window: redistest.FarWindow})
	var events asynqtest.Events
	logs := &logRecorder{}
	th := asynqtest.NewThrottler(t, tg, []worker.Rule{
		worker.Rate("per-queue", worker.Type("sync"), limiter, worker.KeyBy(worker.ByQueue())),
	}, worker.WithObserver(&events), worker.WithLogger(slog.New(logs)))
	t.Cleanup(func() { _ = th.Close(context.Background()) })

	suffix := tg.Prefix[len(tg.Prefix)-9 : len(tg.Prefix)-1]
	configuredQ, bareQ := "configured-"+suffix, "bare-"+suffix
	inspector := asynq.NewInspectorFromRedisClient(tg.NewClient(t))
	client := asynq.NewClientFromRedisClient(tg.NewClient(t))
	t.Cleanup(func() {
		_ = inspector.DeleteQueue(configuredQ, true)
		_ = inspector.DeleteQueue(bareQ, true)
	})
	handler := th.Middleware(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil }))
	start := func(srv *asynq.Server) {
		t.Helper()
		t.Cleanup(srv.Shutdown)
		if err := srv.Start(handler); err != nil {
			t.Fatal(err)
		}
	}
	start(th.NewServer(asynq.Config{Concurrency: 2, Queues: map[string]int{configuredQ: 1}, LogLevel: asynq.FatalLevel}))
	start(asynq.NewServerFromRedisClient(tg.NewClient(t), asynq.Config{Concurrency: 2, Queues: map[string]int{bareQ: 1},
		LogLevel: asynq.FatalLevel, TaskCheckInterval: 100 * time.Millisecond}))

	enqueue := func(queue string) []string {
		t.Helper()
		var ids []string
		for range 3 {
			info, err := client.Enqueue(asynq.NewTask("sync", nil), asynq.Queue(queue), asynq.MaxRetry(5))
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, info.ID)
		}
		return ids
	}
	// waitRetrying waits until two tasks of queue are in the retry set and
	// returns their retry counts.
	waitRetrying := func(queue string) []int {
		t.Helper()
		deadline := time.Now().Add(recordedWithin)
		for {
			tasks, err := inspector.ListRetryTasks(queue)
			if err == nil && len(tasks) == 2 {
				return []int{tasks[0].Retried, tasks[1].Retried}
			}
			if time.Now().After(deadline) {
				t.Fatalf("queue %s: %d tasks retrying after %s (%v), want 2", queue, len(tasks), recordedWithin, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	// The configured server first: its tasks' checks (a look at a flag
	// when each handler's context ends) are done before the bare server
	// gets work, whose reports come after Redis round trips of their own.
	enqueue(configuredQ)
	if retried := waitRetrying(configuredQ); !slices.Equal(retried, []int{0, 0}) {
		t.Fatalf("configured server: retry counts %v, want none used", retried)
	}
	bareIDs := enqueue(bareQ)
	if retried := waitRetrying(bareQ); !slices.Equal(retried, []int{1, 1}) {
		t.Fatalf("bare server: retry counts %v, want one used each (counted as failed)", retried)
	}
	deadline := time.Now().Add(recordedWithin)
	for events.Count(worker.Unconfigured) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: events %v, want 2 unconfigured", recordedWithin, events.ByKind())
		}
		time.Sleep(10 * time.Millisecond)
	}

	for _, e := range events.All() {
		if e.Kind != worker.Unconfigured {
			continue
		}
		if !slices.Contains(bareIDs, e.TaskID) || e.Rule != "per-queue" || e.Key != bareQ || e.TaskType != "sync" {
			t.Errorf("unconfigured event %+v: want a task of the bare server's queue %s", e, bareQ)
		}
	}
	if got := events.ByKind(); got[worker.Unconfigured] != 2 || got[worker.Rescheduled] != 4 || got[worker.Admitted] != 2 {
		t.Errorf("events %v: want 2 admitted, 4 rescheduled, 2 unconfigured", got)
	}
	errorLines := logs.at(slog.LevelError)
	if len(errorLines) != 1 || !strings.Contains(errorLines[0], "call th.Configure(&cfg) before asynq.NewServer") {
		t.Fatalf("error log lines %q: want one naming the fix", errorLines)
	}
}

// logRecorder is a slog.Handler that keeps every record's message by level.
type logRecorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, r)
	return nil
}

func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

// at returns the messages logged at level.
func (l *logRecorder) at(level slog.Level) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.records {
		if r.Level == level {
			out = append(out, r.Message)
		}
	}
	return out
}
