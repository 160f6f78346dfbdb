package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jobthrottle/jobthrottle/internal/gate"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// observeLeases reports each lease the pass holds in Redis (a degraded
// one holds none) as an event of kind k.
func (t *Throttler) observeLeases(ctx context.Context, tk *task, p *pass, k EventKind) {
	for _, l := range p.leases {
		if !l.Degraded() {
			t.observe(ctx, Event{Kind: k, TaskID: tk.id, TaskType: tk.Type(), Rule: l.rule.name, Key: l.key})
		}
	}
}

// watchLeases returns the context the handler runs with while the pass
// holds its leases: ctx, cancelled with a cause wrapping
// throttle.ErrLeaseLost as soon as one of them is lost (it ran out unrenewed,
// or its key was reset), when another holder may already have its slot.
// lost reports the first lease lost, or nil; call it once the handler has
// returned, which also stops the watching.
func (t *Throttler) watchLeases(ctx context.Context, tk *task, p *pass) (running context.Context, lost func() *held) {
	running, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	var once sync.Once
	var first *held
	for i := range p.leases {
		l := &p.leases[i]
		if l.Degraded() {
			continue
		}
		go func() {
			select {
			case <-done:
			case <-l.Lost():
				once.Do(func() {
					first = l
					t.observe(ctx, Event{Kind: LeaseLost, TaskID: tk.id, TaskType: tk.Type(), Rule: l.rule.name, Key: l.key})
					cancel(fmt.Errorf("worker: rule %q lost the task's slot on key %q while the handler ran: %w",
						l.rule.name, l.key, throttle.ErrLeaseLost))
				})
			}
		}()
	}
	return running, func() *held {
		close(done)
		once.Do(func() {}) // no loss reported from now on
		cancel(nil)
		return first
	}
}

// giveBackLeases releases the pass's leases once the handler has ended,
// however it ended; bookings were used and stay. Each release is waited
// for while ctx lives, and finishes in the background after it ends.
// Several leases on the limiters' one client (t.limiterClient) are
// released in one round trip. A release Redis failed is logged: its slot
// stays taken until the lease runs out. (A lease lost was reported when
// it was.)
func (t *Throttler) giveBackLeases(ctx context.Context, p *pass) {
	release := func(ctx context.Context, l held) {
		if err := l.Release(ctx); !errors.Is(err, throttle.ErrLeaseLost) {
			t.notGivenBack(ctx, "its slot of the cap", l.rule, l.key, err)
		}
	}
	if len(p.leases) == 1 || t.limiterClient == nil {
		for _, l := range p.leases {
			release(ctx, l)
		}
		return
	}
	// Several caps on one client: released in one round trip.
	together, done := gate.Together(ctx, t.limiterClient, len(p.leases))
	var wg sync.WaitGroup
	for _, l := range p.leases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer done()
			release(together, l)
		}()
	}
	wg.Wait()
}
