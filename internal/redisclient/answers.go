package redisclient

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Answers tells when a client last had an answer from Redis: a command or
// pipeline that came back without error (or with redis.Nil, "no such
// key"), whoever sent it. The zero value has heard nothing. Safe for
// concurrent use.
type Answers struct {
	last atomic.Int64 // Unix ns of the last answer; 0: none yet
}

// Within reports whether the client had an answer within d.
func (a *Answers) Within(d time.Duration) bool {
	last := a.last.Load()
	return last != 0 && time.Since(time.Unix(0, last)) < d
}

// heard records an answer now.
func (a *Answers) heard() { a.last.Store(time.Now().UnixNano()) }

// answered holds the Answers of each client AnswersOf has hooked, so that
// a client handed to several Throttlers gets one hook.
var answered sync.Map // redis.UniversalClient → *Answers

// AnswersOf returns the Answers of c, hooking c the first time: every
// command through c from then on counts, those of other users of the
// client included (asynq's polls, heartbeats and writes when c is
// asynq's). A hooked client stays in a table of this package until the
// program ends. Safe for concurrent use.
func AnswersOf(c redis.UniversalClient) *Answers {
	if a, ok := answered.Load(c); ok {
		return a.(*Answers)
	}
	a, loaded := answered.LoadOrStore(c, &Answers{})
	if !loaded {
		c.AddHook(answerHook{a.(*Answers)})
	}
	return a.(*Answers)
}

// answerHook records the answers of the client it hooks.
type answerHook struct{ a *Answers }

func (answerHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h answerHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil || errors.Is(err, redis.Nil) {
			h.a.heard()
		}
		return err
	}
}

func (h answerHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if err == nil || errors.Is(err, redis.Nil) {
			h.a.heard()
		}
		return err
	}
}
