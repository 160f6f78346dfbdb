package throttle

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Request is one decision of a batch: N units for Key.
type Request struct {
	Key string
	N   int
}

// AllowMany decides many requests at once, each exactly as AllowN would,
// in one pipelined round trip to Redis (on a Cluster, one per node
// involved), in order: results[i] answers requests[i]. Requests for the same
// key are decided one after another, in order. Use it where many decisions
// are due together, such as a bulk enqueue. Any invalid request fails the
// whole batch before anything is sent. When Redis cannot answer, the
// failure policy decides for the whole batch.
func (l *Limiter) AllowMany(ctx context.Context, requests []Request) ([]Result, error) {
	start := l.began()
	results, err := l.allowMany(ctx, requests)
	for i, req := range requests {
		var r Result
		if err == nil {
			r = results[i]
		}
		l.observe(ctx, OpAllow, req.Key, req.N, start, r, err)
	}
	return results, err
}

func (l *Limiter) allowMany(ctx context.Context, requests []Request) ([]Result, error) {
	// Every request is checked before any is decided, whichever way they
	// are decided below.
	specs := make([]*spec, len(requests))
	for i, req := range requests {
		sp, err := l.specFor(ctx, req.Key)
		if err == nil {
			err = validRequest(req.Key, req.N, sp.capacity)
		}
		if err != nil {
			return nil, fmt.Errorf("request %d: %w", i, err)
		}
		specs[i] = sp
	}
	if l.shares != nil {
		// Each request is decided under this process's share when it
		// holds one.
		results := make([]Result, len(requests))
		for i, req := range requests {
			r, err := l.shares.allow(ctx, l, req.Key, req.N)
			if err != nil {
				return nil, fmt.Errorf("request %d: %w", i, err)
			}
			results[i] = r
		}
		return results, nil
	}
	if l.spec.calendar != nil || l.cfg.acks > 0 {
		// A quota's periods may need asking twice (see runTicket), and a
		// decision that waits for replicas waits for its own writes: one
		// request at a time.
		results := make([]Result, len(requests))
		for i, req := range requests {
			r, err := l.decide(ctx, modeTake, req.Key, req.N)
			if err != nil {
				return nil, fmt.Errorf("request %d: %w", i, err)
			}
			results[i] = r
		}
		return results, nil
	}
	results := make([]Result, len(requests))
	var pending []int // requests that go to Redis
	now := time.Now()
	for i, req := range requests {
		if l.denied != nil {
			if r, ok := l.denied.lookup(req.Key, req.N, specs[i].id, specs[i].capacity, now); ok {
				r.policy = specs[i]
				results[i] = r
				continue
			}
		}
		pending = append(pending, i)
	}
	if len(pending) == 0 {
		return results, nil
	}
	var cmds []*redis.Cmd
	err := l.call(ctx, func(ctx context.Context) error {
		var err error
		cmds, err = l.pipeline(ctx, len(pending), func(j int) ([]string, []any) {
			req := requests[pending[j]]
			return l.scriptArgs(specs[pending[j]], modeTake, req.Key, "", req.N)
		})
		return err
	})
	for j, i := range pending {
		var r reply
		if err == nil {
			r, err = replyOf(cmds[j])
		}
		if err != nil {
			if l.failOpen(ctx, err) {
				for _, i := range pending {
					results[i] = Result{Allowed: true, Limit: specs[i].capacity, Degraded: true, cause: err, policy: specs[i]}
				}
				return results, nil
			}
			return nil, l.unavailable(ctx, err)
		}
		results[i] = resultOf(r, specs[i].capacity)
		results[i].policy = specs[i]
		if l.denied != nil {
			l.note(requests[i].Key, requests[i].N, specs[i], results[i])
		}
	}
	return results, nil
}

// pipeline sends count runs of the policy's script, whose keys and
// arguments call gives, in one pipeline, by SHA. A run Redis answers
// NOSCRIPT (a Redis that does not know the script yet, or whose scripts were
// flushed while the pipeline ran) was not run: only those runs are sent
// again, with the script's text, so that none is decided twice and none
// fails because the scripts were flushed.
func (l *Limiter) pipeline(ctx context.Context, count int, call func(j int) ([]string, []any)) ([]*redis.Cmd, error) {
	l.noteUse()
	cmds := make([]*redis.Cmd, count)
	pipe := l.client.Pipeline()
	for j := range cmds {
		keys, args := call(j)
		cmds[j] = l.spec.script.EvalSha(ctx, pipe, keys, args...)
	}
	if _, err := pipe.Exec(ctx); err == nil || !redis.HasErrorPrefix(err, "NOSCRIPT") {
		return cmds, nil // errors are read per command
	}
	pipe = l.client.Pipeline()
	for j, cmd := range cmds {
		if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			keys, args := call(j)
			cmds[j] = l.spec.script.Eval(ctx, pipe, keys, args...)
		}
	}
	_, _ = pipe.Exec(ctx) // errors are read per command
	return cmds, nil
}

// replyOf reads one pipelined script's integer reply.
func replyOf(cmd *redis.Cmd) (reply, error) {
	values, err := cmd.Slice()
	if err != nil {
		return reply{}, err
	}
	return replyFrom(values)
}
