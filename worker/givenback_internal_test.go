package worker

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// TestWhatCannotBeGivenBackIsLogged: a task given up on gives back its
// booking and its place in a waiting room; when Redis fails those calls,
// each failure is logged at Warn with its rule and key (they were once
// dropped unseen, which hid a waiting room that could not be left).
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
	var logged bytes.Buffer
	th, err := New(client, []Rule{
		Rate("booked", AnyTask(), meter("per-partner"), KeyBy(Constant("partner-1"))),
		Rate("room", AnyTask(), meter("overall"), KeyBy(Constant("all")), FairBy(ByType())),
	}, WithLogger(slog.New(slog.NewTextHandler(&logged, nil))))
	if err != nil {
		t.Fatal(err)
	}
	mr.Close()
	tk := &task{Task: asynq.NewTask("sync", nil), id: "t1", origin: "t1", ticket: "t1", queue: "default",
		keys: []string{"partner-1", "all"}, costs: []int{1, 1}}
	th.forgetKept(context.Background(), tk)
	for _, want := range []string{
		`level=WARN msg="worker: could not give back its booking" rule=booked key=partner-1 error="throttle: redis unavailable`,
		`level=WARN msg="worker: could not give back its place in the waiting room" rule=room key=all error="throttle: redis unavailable`,
	} {
		if !strings.Contains(logged.String(), want) {
			t.Errorf("the log lacks %s:\n%s", want, logged.String())
		}
	}
}
