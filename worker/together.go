package worker

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/gate"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// tryTogether asks every concurrency cap and window rule of a task at once,
// in one round trip, when it has rules of both kinds and no meter: a task
// admitted at once then costs one call, not one per rule. A cap must have
// a slot free now and a window room now. It returns nil when the rules are
// not of that kind, or when any of them refused (what the others took is
// given back): the task then goes through its rules one after another as
// before, waiting in a cap's line or for a window. A key set refused here
// is not tried together again for a second, so that a throttled fleet
// does not pay for both ways.
func (t *Throttler) tryTogether(ctx context.Context, tk *task, rules []*Rule, roles []int) *pass {
	caps, windows := 0, 0
	for i, r := range rules {
		switch {
		case r.conc != nil:
			caps++
		case roles[i] != 0:
			return nil // a meter: its start goes through its own path
		default:
			windows++
		}
	}
	if caps+windows < 2 || !t.sameClient || t.together.refusedLately(tk.keysOf(rules)) {
		return nil
	}
	ctx2, done := gate.Together(ctx, t.limiterClient, len(rules))
	leases := make([]*throttle.Lease, len(rules))
	reservations := make([]*throttle.Reservation, len(rules))
	errs := make([]error, len(rules))
	var wg sync.WaitGroup
	for i, r := range rules {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer done()
			if r.conc != nil {
				var got any
				got, _, errs[i] = gate.CapWait(ctx2, r.conc, tk.keys[i], tk.waiterID(), 0)
				if got != nil {
					leases[i] = got.(*throttle.Lease)
				}
				return
			}
			reservations[i], errs[i] = r.limiter.Reserve(ctx2, tk.keys[i], tk.costs[i], 0)
		}()
	}
	wg.Wait()
	t.noteAnswer()
	p := &pass{}
	admitted := true
	for i, r := range rules {
		switch {
		case leases[i] != nil:
			p.leases = append(p.leases, held{leases[i], r, tk.keys[i]})
			p.degraded = p.degraded || leases[i].Degraded()
		case reservations[i] != nil && reservations[i].OK:
			p.windows = append(p.windows, booking{reservations[i], r, tk.keys[i]})
			p.degraded = p.degraded || reservations[i].Degraded
		default:
			admitted = false
		}
		if errs[i] != nil {
			admitted = false
		}
	}
	if admitted {
		return p
	}
	p.giveBack(ctx)
	t.together.refused(tk.keysOf(rules))
	return nil
}

// leaseClient is the client a task's caps are released through together,
// or nil when its rules' limiters do not share one.
func (t *Throttler) leaseClient() any {
	if !t.sameClient {
		return nil
	}
	return t.limiterClient
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
