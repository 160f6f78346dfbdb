package redisclient

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// TestAnswersCountEveryAnswerOfTheClient: a command or pipeline that comes
// back (redis.Nil included) counts as an answer, whoever sent it; one that
// fails does not; a client is hooked once however often it is asked for.
func TestAnswersCountEveryAnswerOfTheClient(t *testing.T) {
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	a := AnswersOf(c)
	if AnswersOf(c) != a {
		t.Fatal("a second AnswersOf of one client returned another Answers")
	}
	if a.Within(time.Hour) {
		t.Fatal("an answer heard before any command")
	}
	steps := []struct {
		name  string
		run   func() error
		heard bool
	}{
		{"GET of a missing key (redis.Nil)", func() error { return c.Get(ctx, "missing").Err() }, true},
		{"SET", func() error { return c.Set(ctx, "k", "v", 0).Err() }, true},
		{"a pipeline", func() error {
			_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error { p.Get(ctx, "k"); p.Incr(ctx, "n"); return nil })
			return err
		}, true},
		{"a command to a stopped server", func() error { m.Close(); return c.Ping(ctx).Err() }, false},
		{"a pipeline to a stopped server", func() error {
			_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error { p.Get(ctx, "k"); return nil })
			return err
		}, false},
	}
	for _, s := range steps {
		a.last.Store(1) // long ago
		err := s.run()
		if got := a.Within(time.Minute); got != s.heard {
			t.Errorf("%s (err %v): heard %v, want %v", s.name, err, got, s.heard)
		}
	}
}
