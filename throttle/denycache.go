package throttle

import (
	"sync"
	"time"
)

// denyCache remembers rejections Redis gave, so that this process can
// answer further requests for the same key locally until the rejection's
// wait has passed. It only ever denies what Redis denied: a request is
// answered locally only when it asks for at least as many units as the one
// Redis rejected, before that rejection's RetryAfter ends (timed from when
// the answer arrived, so never earlier than on Redis's clock). It is safe
// for concurrent use.
type denyCache struct {
	mu      sync.Mutex
	max     int
	entries map[string]denial
}

type denial struct {
	n            int       // units of the rejected request
	until, reset time.Time // its RetryAfter and ResetAfter, on this clock
}

func newDenyCache(max int) *denyCache {
	return &denyCache{max: max, entries: make(map[string]denial)}
}

// lookup returns a local rejection of n units for key, if Redis's still
// holds.
func (c *denyCache) lookup(key string, n int, limit int, now time.Time) (Result, bool) {
	c.mu.Lock()
	d, ok := c.entries[key]
	c.mu.Unlock()
	if !ok || n < d.n || !now.Before(d.until) {
		return Result{}, false
	}
	return Result{
		Limit:      limit,
		RetryAfter: d.until.Sub(now),
		ResetAfter: max(d.reset.Sub(now), d.until.Sub(now)),
		Cached:     true,
	}, true
}

// remember records a rejection of n units for key.
func (c *denyCache) remember(key string, n int, r Result, now time.Time) {
	d := denial{n: n, until: now.Add(r.RetryAfter), reset: now.Add(r.ResetAfter)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.entries[key]; ok && old.n < n && now.Before(old.until) {
		return // a rejection of fewer units says more
	}
	if len(c.entries) >= c.max {
		c.sweep(now)
		if len(c.entries) >= c.max {
			return // full of live rejections: this one goes to Redis again
		}
	}
	c.entries[key] = d
}

// forget drops key's rejection: after an admission, a Reset or a change.
func (c *denyCache) forget(key string) {
	c.mu.Lock()
	delete(c.entries, key)
	c.mu.Unlock()
}

// sweep drops the rejections that have run out. Called with mu held.
func (c *denyCache) sweep(now time.Time) {
	for key, d := range c.entries {
		if !now.Before(d.until) {
			delete(c.entries, key)
		}
	}
}
