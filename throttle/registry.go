package throttle

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keyspace"
)

// The registry of limiter names: one hash per prefix,
// keyspace.Registry(prefix), whose fields are the names of the limiters
// that decided under the prefix and whose values are their policies in
// code, whether they apply stored policies (WithLivePolicies) and the
// worker's rules that use them, as JSON (keyspace.Entry). A named limiter's keys carry its name and algorithm, not
// its policy: throttlectl and the dashboard read the registry to know
// what a name's limit is when no policy is stored for it. Each limiter
// writes its entry in the background on its first decision and again
// every registryEvery while it decides, and the hash lives registryTTL
// past the last write. Where processes run different policies in code
// under one name (a rollout), the last to write is shown.
const (
	registryEvery = time.Hour
	registryTTL   = 30 * 24 * time.Hour
	// registryRetry is how soon a failed write is tried again.
	registryRetry = 10 * time.Second
	// registryLimit bounds a write.
	registryLimit = time.Second
)

// registration is a limiter's entry in the registry. Safe for concurrent
// use.
type registration struct {
	key, name string
	due       atomic.Int64 // when the next write is due, in Unix ns; 0 at first
	busy      atomic.Bool

	mu    sync.Mutex
	entry keyspace.Entry
}

func newRegistration(prefix, name string, entry keyspace.Entry) *registration {
	return &registration{key: keyspace.Registry(prefix), name: name, entry: entry}
}

// addRule records that a worker's rule uses the limiter, and has the entry
// written again on the next decision.
func (r *registration) addRule(rule string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !slices.Contains(r.entry.Rules, rule) {
		r.entry.Rules = append(r.entry.Rules, rule)
		slices.Sort(r.entry.Rules)
		r.due.Store(0)
	}
}

// value returns the entry as the registry stores it.
func (r *registration) value() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.entry.Value()
}

// noteUse writes the limiter's entry in the background when it is due.
// It costs a decision a clock read and an atomic load when it is not.
func (c *conn) noteUse() {
	r := c.registry
	if r == nil || time.Now().UnixNano() < r.due.Load() || !r.busy.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer r.busy.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), registryLimit)
		defer cancel()
		written := r.value()
		pipe := c.client.Pipeline()
		pipe.HSet(ctx, r.key, r.name, written)
		pipe.Expire(ctx, r.key, registryTTL)
		next := registryEvery
		if _, err := pipe.Exec(ctx); err != nil {
			next = registryRetry // Redis failures are the decisions' to report
		}
		if r.value() != written {
			next = 0 // a rule was added meanwhile: write it on the next decision
		}
		r.due.Store(time.Now().Add(next).UnixNano())
	}()
}
