package dashboard

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// decisions returns one decision per key of limiters × keys, outcomes
// alternating.
func decisions(tb testing.TB, limiters, keys int) []throttle.Decision {
	tb.Helper()
	var out []throttle.Decision
	for l := range limiters {
		for k := range keys {
			out = append(out, decision(fmt.Sprintf("limiter-%d", l), fmt.Sprintf("tenant-%d", k), throttle.OpAllow, throttle.Outcome(k%2)))
		}
	}
	if len(out) == 0 {
		tb.Fatal("no decisions to observe")
	}
	return out
}

func BenchmarkPublisherObserve(b *testing.B) {
	r := redistest.Embedded(b)
	p, err := NewPublisher(r.Client, WithPublishPrefix(r.Prefix), manualFlush())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = p.Close(context.Background()) })
	ds := decisions(b, 10, 100)
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(7919)) // goroutines start at different keys
		for pb.Next() {
			p.ObserveDecision(context.Background(), ds[i%len(ds)])
			i++
		}
	})
}

func BenchmarkPublisherFlush(b *testing.B) {
	r := redistest.New(b)
	p, err := NewPublisher(r.Client, WithPublishPrefix(r.Prefix), manualFlush())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = p.Close(context.Background()) })
	ds := decisions(b, 10, 100)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	commands := 0
	for b.Loop() {
		b.StopTimer()
		for _, d := range ds { // a typical interval: 10 limiters × 100 keys, 3 decisions each
			p.ObserveDecision(context.Background(), d)
			p.ObserveDecision(context.Background(), d)
			p.ObserveDecision(context.Background(), d)
		}
		b.StartTimer()
		if err := p.flush(ctx); err != nil {
			b.Fatal(err)
		}
		commands = p.sent
	}
	b.ReportMetric(float64(commands), "commands/flush")
}

// wireCounter counts the commands and bytes of the pipelines a client
// sends (RESP-encoded arguments).
type wireCounter struct {
	mu              sync.Mutex
	commands, bytes int
	names           []string
}

func (w *wireCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (w *wireCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		w.add(cmd)
		return next(ctx, cmd)
	}
}

func (w *wireCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			w.add(cmd)
		}
		return next(ctx, cmds)
	}
}

func (w *wireCounter) add(cmd redis.Cmder) {
	if name := cmd.Name(); name == "client" || name == "hello" {
		// a new connection's set-up (CLIENT SETINFO), not the flush's: a
		// late TIME of the Publisher's start, running beside a flush,
		// needs a second connection
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.names = append(w.names, cmd.Name())
	w.commands++
	args := cmd.Args()
	w.bytes += len(fmt.Sprintf("*%d\r\n", len(args)))
	for _, a := range args {
		s := fmt.Sprint(a)
		w.bytes += len(fmt.Sprintf("$%d\r\n", len(s))) + len(s) + 2
	}
}

// TestPublishCost measures one flush's commands and bytes for 1, 100 and
// 1000 active keys of one limiter over a two-second interval, checks them
// against the layout's formula, and checks that counting a decision
// allocates nothing once its key is known in the second.
func TestPublishCost(t *testing.T) {
	const seconds = 2
	line := "figures:"
	for _, keys := range []int{1, 100, 1000} {
		r := redistest.Embedded(t)
		clock := newTestClock(t, r)
		client := r.NewClient(t)
		wire := &wireCounter{}
		client.AddHook(wire)
		p, err := newPublisher(client, clock.Now, WithPublishPrefix(r.Prefix), manualFlush(), WithPublisherLogger(nil))
		if err != nil {
			t.Fatal(err)
		}
		ds := decisions(t, 1, keys)
		for range seconds {
			for _, d := range ds {
				p.ObserveDecision(context.Background(), d)
			}
			clock.Advance(time.Second)
		}
		if err := p.flush(context.Background()); err != nil { // measures the clock first
			t.Fatal(err)
		}
		wire.mu.Lock()
		wire.commands, wire.bytes, wire.names = 0, 0, nil
		wire.mu.Unlock()
		for range seconds {
			for _, d := range ds {
				p.ObserveDecision(context.Background(), d)
			}
			clock.Advance(time.Second)
		}
		if err := p.flush(context.Background()); err != nil {
			t.Fatal(err)
		}
		// per second: one field per count that is not zero (admitted or
		// throttled here) for the limiter and for each key; per minute
		// (one here): an EXPIRE of each of the limiter's hash and two sets,
		// and per key an EXPIRE, a ZINCRBY of the set its count is in;
		// then the limiters' hash (HSET, EXPIRE), the processes' set
		// (ZADD, ZREMRANGEBYSCORE, EXPIRE) and the clock (TIME).
		fields := 1
		if keys > 1 {
			fields = 2
		}
		bound := seconds*fields + 3 + keys*(seconds+2) + 2 + 3
		if p.sent > bound {
			t.Errorf("%d keys: %d commands in the flush's pipeline, formula allows %d", keys, p.sent, bound)
		}
		wire.mu.Lock()
		// the pipeline and TIME; perhaps the TIME the Publisher's goroutine
		// sends when it starts, if it came late
		if wire.commands != p.sent+1 && wire.commands != p.sent+2 {
			t.Errorf("%d keys: %d commands on the wire, want the pipeline's %d and TIME: %q", keys, wire.commands, p.sent, wire.names)
		}
		line += fmt.Sprintf(" %d keys: %d commands, %d bytes per flush;", keys, wire.commands, wire.bytes)
		wire.mu.Unlock()
		_ = p.Close(context.Background())
	}

	r := redistest.Embedded(t)
	p, _ := testPublisher(t, r, nil)
	d := decision("api", "acme", throttle.OpAllow, throttle.Throttled)
	p.ObserveDecision(context.Background(), d)
	if allocs := testing.AllocsPerRun(1000, func() { p.ObserveDecision(context.Background(), d) }); allocs > 0.01 {
		t.Errorf("ObserveDecision allocates %.2f times per call for a known key", allocs)
	}
	// memory: a second of counts is 32 bytes; between two flushes at most
	// maxLimiters × keys × seconds of them, and through failed flushes at
	// most maxHeldSeconds for the keys and 15 minutes for each limiter
	const cell = 32
	held := maxHeldSeconds*cell + maxLimiters*15*60*cell
	line += fmt.Sprintf(" memory held through an outage at most %d MB of counts (%d key-seconds, %d limiters × 900 s, 32 B each), plus the live interval's %d limiters × %d keys × its seconds",
		held>>20, maxHeldSeconds, maxLimiters, maxLimiters, 1000)
	t.Log(line)
}
