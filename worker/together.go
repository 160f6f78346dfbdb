package worker

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/gate"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// tryTogether asks all of a task's rules at once, in one round trip, when
// asking them in turn would take more than one: its concurrency caps, each
// of which must have a slot free now, its windows, and its meters (all in
// one call, as in turn). A task admitted at once then costs one call
// whatever its rules. What it returns is what asking in turn would have:
// the task admitted; refused by a window (the first in order), or by its
// meters, everything else given back. When a cap has no slot free, what
// the others took is given back and it returns nil: the task goes through
// its rules in turn, waiting in the cap's line first. A task does not
// enter a waiting room here: refused by a room's meter, it enters
// in a call of its own. A key set refused here is not asked together again
// for a second, so that a throttled fleet does not pay for both ways.
func (t *Throttler) tryTogether(ctx context.Context, tk *task, rules []*Rule, roles []int, budget time.Duration) *pass {
	calls, meters := 0, false
	for i, r := range rules {
		switch {
		case r.conc != nil || roles[i] == 0:
			calls++
		case !meters:
			meters = true
			calls++
		}
	}
	if calls < 2 || t.limiterClient == nil {
		return nil
	}
	keys := tk.keysOf(rules)
	if t.together.refusedLately(keys) {
		return nil
	}
	ctx2, done := gate.Together(ctx, t.limiterClient, calls)
	leases := make([]*throttle.Lease, len(rules))
	reservations := make([]*throttle.Reservation, len(rules))
	errs := make([]error, len(rules))
	mp := &pass{}
	var wg sync.WaitGroup
	ask := func(fn func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer done()
			fn()
		}()
	}
	for i, r := range rules {
		switch {
		case r.conc != nil:
			ask(func() {
				var got any
				got, _, _, errs[i] = gate.CapWait(ctx2, r.conc, tk.keys[i], tk.waiterID(), 0, nil)
				if got != nil {
					leases[i] = got.(*throttle.Lease)
				}
			})
		case roles[i] == 0:
			ask(func() { reservations[i], errs[i] = r.limiter.Reserve(ctx2, tk.keys[i], tk.costs[i], 0) })
		}
	}
	if meters {
		ask(func() { mp = t.meterPass(ctx2, mp, tk, rules, roles, budget, false) })
	}
	wg.Wait()

	p := &pass{}
	capsOK := true
	var window *refusal // the first window's refusal, in order
	for i, r := range rules {
		switch {
		case r.conc != nil:
			if leases[i] == nil {
				capsOK = false
				continue
			}
			p.leases = append(p.leases, held{leases[i], r, tk.keys[i]})
			p.degraded = p.degraded || leases[i].Degraded()
		case roles[i] == 0:
			res := reservations[i]
			switch {
			case errs[i] != nil && window == nil:
				window = &refusal{rule: r, key: tk.keys[i], retryAfter: unavailableBackoff, how: waitOrRetry, err: errs[i]}
			case errs[i] != nil:
			case !res.OK && window == nil:
				window = &refusal{rule: r, key: tk.keys[i], retryAfter: res.RetryAfter, how: waitOrRetry}
			case res.OK:
				p.windows = append(p.windows, booking{res, r, tk.keys[i]})
				p.degraded = p.degraded || res.Degraded
			}
		}
	}
	switch {
	case !capsOK:
		mp.giveBack(ctx)
		p.giveBack(ctx)
		t.together.refused(keys)
		return nil
	case window != nil:
		mp.giveBack(ctx)
		p.giveBack(ctx)
		p.refused = window
		t.together.refused(keys)
		return p
	case mp.refused != nil:
		p.giveBack(ctx)
		t.together.refused(keys)
		return mp
	}
	p.starts, p.claims = mp.starts, mp.claims
	p.delay, p.degraded = mp.delay, p.degraded || mp.degraded
	return p
}

// keysOf names the rules a task passes and its key in each.
func (tk *task) keysOf(rules []*Rule) string {
	var b strings.Builder
	for i, r := range rules {
		b.WriteString(r.name)
		b.WriteByte(0)
		b.WriteString(tk.keys[i])
		b.WriteByte(0)
	}
	return b.String()
}

// refusals remembers the key sets refused lately when asked together.
// Safe for concurrent use; the zero value is empty.
type refusals struct {
	mu   sync.Mutex
	when map[string]time.Time
}

// refusedFor is how long a key set refused together goes one rule after
// another; refusalsKept bounds how many key sets are remembered.
const (
	refusedFor   = time.Second
	refusalsKept = 4096
)

func (r *refusals) refused(keys string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.when == nil || len(r.when) >= refusalsKept {
		r.when = map[string]time.Time{}
	}
	r.when[keys] = time.Now()
}

func (r *refusals) refusedLately(keys string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.when[keys]
	if ok && time.Since(at) >= refusedFor {
		delete(r.when, keys)
		return false
	}
	return ok
}
