package throttle

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// coalescer gathers the decisions callers of one Limiter ask for while
// enough round trips are in flight and sends them together in the next
// one, so that under concurrency many decisions share one pipelined round
// trip. Nothing waits on a timer: while fewer than lanes round trips are in
// flight a caller sends its own at once, so callers few enough to keep the
// connections busy pay nothing for it.
type coalescer struct {
	limit int // most decisions in one round trip
	lanes int // round trips in flight before callers queue

	mu       sync.Mutex
	pending  []*waiting
	inflight int
}

// waiting is one caller's decision, queued.
type waiting struct {
	sp   *spec
	mode int
	key  string
	n    int
	done chan struct{} // closed when r and err are set
	r    reply
	err  error
}

// decide has the decision made in a round trip of its own when a lane is
// free, or else in one shared with whatever other decisions are waiting.
// A queued caller waits at most the Limiter's timeout in all: one whose
// ctx ends, or whose timeout passes, before its decision was sent leaves
// the queue and its decision is never made; one whose ctx ends while its
// shared round trip is in flight gets ctx's error, though Redis may have
// applied the decision (as with any call given up mid-flight).
func (b *coalescer) decide(ctx context.Context, l *Limiter, sp *spec, mode, n int, key string) (reply, error) {
	b.mu.Lock()
	if b.inflight < b.lanes {
		b.inflight++
		b.mu.Unlock()
		r, err := l.run(ctx, sp, mode, key, n)
		b.next(ctx, l)
		return r, err
	}
	w := &waiting{sp: sp, mode: mode, key: key, n: n, done: make(chan struct{})}
	b.pending = append(b.pending, w)
	b.mu.Unlock()
	var expired <-chan time.Time
	if l.cfg.timeout > 0 {
		timer := time.NewTimer(l.cfg.timeout)
		defer timer.Stop()
		expired = timer.C
	}
	select {
	case <-w.done:
		return w.r, w.err
	case <-ctx.Done():
		b.leave(w)
		return reply{}, ctx.Err()
	case <-expired:
		b.leave(w)
		return reply{}, fmt.Errorf("%w after %s, waiting for a round trip", context.DeadlineExceeded, l.cfg.timeout)
	}
}

// take removes up to limit waiting decisions from the queue; b.mu is held.
func (b *coalescer) take() []*waiting {
	k := min(len(b.pending), b.limit)
	batch := make([]*waiting, k)
	copy(batch, b.pending)
	rest := copy(b.pending, b.pending[k:])
	clear(b.pending[rest:])
	b.pending = b.pending[:rest]
	return batch
}

// next ends a caller's own round trip and frees its lane, or, when
// decisions queued up meanwhile, hands the lane to a goroutine that sends
// them (and any that queue up after, until none is left), so that the
// caller is answered now. ctx gives the goroutine the caller's values,
// never its cancellation: the round trips serve others.
func (b *coalescer) next(ctx context.Context, l *Limiter) {
	b.mu.Lock()
	if len(b.pending) == 0 {
		b.inflight--
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	detached := context.WithoutCancel(ctx)
	go func() {
		for {
			b.mu.Lock()
			if len(b.pending) == 0 {
				b.inflight--
				b.mu.Unlock()
				return
			}
			batch := b.take()
			b.mu.Unlock()
			b.send(detached, l, batch)
		}
	}()
}

// leave removes w from the queue if it has not been taken into a round
// trip yet.
func (b *coalescer) leave(w *waiting) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, p := range b.pending {
		if p == w {
			b.pending = append(b.pending[:i], b.pending[i+1:]...)
			return
		}
	}
}

// send makes the batch's decisions in one pipelined round trip under the
// Limiter's timeout and answers each caller.
func (b *coalescer) send(ctx context.Context, l *Limiter, batch []*waiting) {
	if len(batch) == 1 {
		w := batch[0]
		w.r, w.err = l.runTicket(ctx, w.sp, w.mode, w.key, "", w.n)
		close(w.done)
		return
	}
	var cmds []*redis.Cmd
	err := l.call(ctx, func(ctx context.Context) error {
		var err error
		cmds, err = l.pipeline(ctx, len(batch), func(j int) ([]string, []any) {
			return l.scriptArgs(batch[j].sp, batch[j].mode, batch[j].key, "", batch[j].n)
		})
		return err
	})
	for j, w := range batch {
		if err == nil {
			w.r, w.err = replyOf(cmds[j])
			if w.err == nil && w.r.n < 5 {
				w.err = errShortReply(w.r.n)
			}
		} else {
			w.err = err
		}
		close(w.done)
	}
}

// coalesceLanes is how many round trips of its own a coalescing Limiter
// lets callers send at once before they queue: enough to keep a few
// connections busy, so that a handful of callers are never slowed down by
// queueing behind each other (measured in bench/: with one lane, two
// callers got 0.6× the decisions of no coalescing; with four, 1.0×).
const coalesceLanes = 4
