package throttle

import (
	"context"
	"sync"

	"github.com/jobthrottle/jobthrottle/internal/gate"
	"github.com/redis/go-redis/v9"
)

func init() {
	gate.Together = together
}

// together is [gate.Together]: calls made with the returned context by the
// n goroutines of one task's decision wait for each other and go to Redis
// in one pipelined round trip on client (on a Cluster, one per node).
func together(ctx context.Context, client any, n int) (context.Context, func()) {
	c, ok := client.(redis.UniversalClient)
	if !ok || n < 1 {
		return ctx, func() {}
	}
	b := &batch{client: c, expect: n}
	return context.WithValue(ctx, batchKey{}, b), b.leave
}

type batchKey struct{}

// batch gathers the first script call of each of its goroutines and sends
// them together once every goroutine has made one or left (see together).
// A call made after the batch was sent goes on its own.
type batch struct {
	client redis.UniversalClient

	mu     sync.Mutex
	expect int // goroutines that may still make a call
	calls  []*batchCall
	sent   bool
}

// batchCall is one script call waiting in a batch.
type batchCall struct {
	script *redis.Script
	keys   []string
	args   []any
	cmd    *redis.Cmd
	done   chan struct{} // closed once cmd has its reply
}

// leave says a goroutine of the batch has ended: it makes no (more) call.
func (b *batch) leave() {
	b.mu.Lock()
	b.expect--
	calls := b.readyLocked()
	b.mu.Unlock()
	b.send(context.Background(), calls)
}

// readyLocked returns the calls to send when every goroutine left has
// made its call, and marks the batch sent. b.mu is held.
func (b *batch) readyLocked() []*batchCall {
	if b.sent || len(b.calls) == 0 || len(b.calls) < b.expect {
		return nil
	}
	b.sent = true
	return b.calls
}

// send sends calls in one pipeline, on the context of the call that
// completed the batch less its cancellation (each caller waits on its own
// context, see runCmd; the exchange ends within the client's timeouts),
// and hands each its reply. A script Redis does not know yet is loaded and
// run on its own (EVALSHA's NOSCRIPT, as redis.Script.Run does).
func (b *batch) send(ctx context.Context, calls []*batchCall) {
	if len(calls) == 0 {
		return
	}
	ctx = context.WithoutCancel(ctx)
	pipe := b.client.Pipeline()
	for _, c := range calls {
		c.cmd = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
	}
	_, _ = pipe.Exec(ctx)
	for _, c := range calls {
		if redis.HasErrorPrefix(c.cmd.Err(), "NOSCRIPT") {
			c.cmd = c.script.Run(ctx, b.client, c.keys, c.args...)
		}
		close(c.done)
	}
}

// runCmd runs script as redis.Script.Run does, or, when ctx is of a batch
// that is not sent yet and client is the batch's, as the caller's part of
// the batch's one round trip. A caller whose ctx ends while it waits for
// the others gets ctx's error, though its call may still be sent with the
// batch (as with any call given up mid-flight).
func runCmd(ctx context.Context, client redis.UniversalClient, script *redis.Script, keys []string, args []any) *redis.Cmd {
	b, _ := ctx.Value(batchKey{}).(*batch)
	if b == nil || b.client != client {
		return script.Run(ctx, client, keys, args...)
	}
	b.mu.Lock()
	if b.sent {
		b.mu.Unlock()
		return script.Run(ctx, client, keys, args...)
	}
	c := &batchCall{script: script, keys: keys, args: args, done: make(chan struct{})}
	b.calls = append(b.calls, c)
	calls := b.readyLocked()
	b.mu.Unlock()
	b.send(ctx, calls)
	select {
	case <-c.done:
		return c.cmd
	case <-ctx.Done():
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(ctx.Err())
		return cmd
	}
}
