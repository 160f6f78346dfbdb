package worker

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// TestWhatCannotBeGivenBackIsLogged: a task given up on gives back its
// booking, its place in a waiting room and its place in a cap's line, and
// a task that ran gives back its slot of the cap; when Redis fails those
// calls, each failure is logged at Warn with its rule and key (they were
// once dropped unseen, which hid a waiting room that could not be left).
// So is a count of throttles that fails, which gives nobody up.
func TestWhatCannotBeGivenBackIsLogged(t *testing.T) {
	mr := miniredis.RunT(t)
	redistest.QuietRedisLog()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	meter := func(name string) *throttle.Limiter {
		l, err := throttle.New(client, name, throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	conc, err := throttle.NewConcurrencyLimiter(client, "cap", throttle.Concurrency{Limit: 2, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var logged bytes.Buffer
	th, err := New(client, []Rule{
		Rate("booked", AnyTask(), meter("per-partner"), KeyBy(Constant("partner-1")), GiveUp(GiveUpPolicy{MaxThrottles: 3})),
		Rate("room", AnyTask(), meter("overall"), KeyBy(Constant("all")), FairBy(ByType())),
		Concurrency("cap", AnyTask(), conc, KeyBy(Constant("one"))),
	}, WithLogger(slog.New(slog.NewTextHandler(&logged, nil))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = th.Close(context.Background()) })
	ctx := context.Background()
	lease, _, err := conc.Acquire(ctx, "one")
	if err != nil || lease == nil {
		t.Fatalf("Acquire: %v, %v", lease, err)
	}
	mr.Close()
	tk := &task{Task: asynq.NewTask("sync", nil), id: "t1", origin: "t1", ticket: "t1", queue: "default",
		keys: []string{"partner-1", "all", "one"}, costs: []int{1, 1, 1}}
	th.forgetKept(ctx, tk)
	th.giveBackLeases(ctx, &pass{leases: []held{{lease, th.rule("cap"), "one"}}})
	if gave := th.giveUp(ctx, tk, &refusal{rule: th.rule("booked"), key: "partner-1"}); gave != nil {
		t.Fatalf("giveUp with Redis down: %v; want no give-up", gave)
	}
	for _, want := range []string{
		`level=WARN msg="worker: could not give back its booking" rule=booked key=partner-1 error="throttle: redis unavailable`,
		`level=WARN msg="worker: could not give back its place in the waiting room" rule=room key=all error="throttle: redis unavailable`,
		`level=WARN msg="worker: could not give back its place in the cap's line" rule=cap key=one error="throttle: redis unavailable`,
		`level=WARN msg="worker: could not give back its slot of the cap" rule=cap key=one error="throttle: redis unavailable`,
		`level=WARN msg="worker: could not count the task's throttles; not given up on this time" task_id=t1 rule=booked key=partner-1`,
	} {
		if !strings.Contains(logged.String(), want) {
			t.Errorf("the log lacks %s:\n%s", want, logged.String())
		}
	}
}

// TestTheDispatchersFailuresAreLogged: a waiting room's release that Redis
// fails is logged at Warn, with its rule and key; the failures that follow
// within failureLogEvery (the dispatcher tries again every 100 ms) are
// counted into the next log, not logged one by one.
func TestTheDispatchersFailuresAreLogged(t *testing.T) {
	mr := miniredis.RunT(t)
	redistest.QuietRedisLog()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	overall, err := throttle.New(client, "overall", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1})
	if err != nil {
		t.Fatal(err)
	}
	var logged bytes.Buffer
	th, err := New(client, []Rule{Rate("room", AnyTask(), overall, KeyBy(Constant("all")), FairBy(ByType()))},
		WithLogger(slog.New(slog.NewTextHandler(&logged, nil))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = th.Close(context.Background()) })
	mr.Close()
	ctx := context.Background()
	for range 3 {
		if next := th.releaseFrom(ctx, th.rule("room"), "all", time.Now()); time.Until(next) > time.Second {
			t.Fatalf("the next release after a failure in %s; want 100ms", time.Until(next))
		}
	}
	const want = `level=WARN msg="worker: redis failed a waiting room's release (rule room); trying again in 100ms" key=all failures_not_logged=0 error="throttle: redis unavailable`
	if got := strings.Count(logged.String(), "level=WARN"); got != 1 || !strings.Contains(logged.String(), want) {
		t.Fatalf("%d warnings after 3 failed calls; want 1, %s:\n%s", got, want, logged.String())
	}
	// The next log, failureLogEvery later, counts the 2 held back.
	if ok, held := th.dispatch.failures.Allow(time.Now().Add(failureLogEvery), failureLogEvery); !ok || held != 2 {
		t.Fatalf("a log failureLogEvery later: let through %v, counting %d held back; want through, 2", ok, held)
	}
}
