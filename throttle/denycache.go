package throttle

import (
	"container/heap"
	"sync"
	"time"
)

// denyCache remembers rejections Redis gave, so that this process can
// answer further requests for the same key locally until the rejection's
// wait has passed. It only ever denies what Redis denied: a request is
// answered locally only when it asks for at least as many units as the one
// Redis rejected, before that rejection's RetryAfter ends (timed from when
// the answer arrived, so never earlier than on Redis's clock), and while the
// policy that made it is still the one in force for the key: a rejection
// made under a policy since changed (a stored policy, a plan) is forgotten
// and the request goes to Redis, which judges it under the new one. It is
// safe for concurrent use.
//
// Every operation is O(log n) amortised: rejections that ran out leave
// through a heap ordered by when they run out, never by a sweep of the
// whole cache.
type denyCache struct {
	mu      sync.Mutex
	max     int
	entries map[string]denial
	// expiry holds the end of every rejection remembered, soonest first.
	// An entry whose key was since forgotten or remembered again is stale:
	// it is skipped when it comes out, and dropped when the heap is rebuilt.
	expiry expiryHeap
}

type denial struct {
	n            int       // units of the rejected request
	until, reset time.Time // its RetryAfter and ResetAfter, on this clock
	// policy is the id of the policy that made the rejection; "" for a
	// block, which holds whatever the policy.
	policy string
}

func newDenyCache(max int) *denyCache {
	return &denyCache{max: max, entries: make(map[string]denial)}
}

// lookup returns a local rejection of n units for key under the policy
// policy (a spec's id), if Redis's still holds. A rejection made under
// another policy is forgotten.
func (c *denyCache) lookup(key string, n int, policy string, limit int, now time.Time) (Result, bool) {
	c.mu.Lock()
	d, ok := c.entries[key]
	if ok && d.policy != "" && d.policy != policy {
		delete(c.entries, key)
		ok = false
	}
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

// remember records a rejection of n units for key, made under policy (a
// spec's id; "" for a block, whatever the policy). When the cache is full
// of rejections that still hold, it is not recorded: the next request for
// key goes to Redis again.
func (c *denyCache) remember(key string, n int, policy string, r Result, now time.Time) {
	d := denial{n: n, until: now.Add(r.RetryAfter), reset: now.Add(r.ResetAfter), policy: policy}
	c.mu.Lock()
	defer c.mu.Unlock()
	old, known := c.entries[key]
	if known && old.n < n && now.Before(old.until) && old.policy == policy {
		return // a rejection of fewer units says more
	}
	c.dropExpired(now)
	if _, known = c.entries[key]; !known && len(c.entries) >= c.max {
		return
	}
	c.entries[key] = d
	heap.Push(&c.expiry, expiring{key: key, until: d.until})
	if len(c.expiry) > 2*len(c.entries)+64 {
		c.rebuild()
	}
}

// forget drops key's rejection: after an admission, a Reset or a change.
func (c *denyCache) forget(key string) {
	c.mu.Lock()
	delete(c.entries, key)
	c.mu.Unlock()
}

// dropExpired removes the rejections that have run out, soonest first.
// Called with mu held.
func (c *denyCache) dropExpired(now time.Time) {
	for len(c.expiry) > 0 && !now.Before(c.expiry[0].until) {
		e := heap.Pop(&c.expiry).(expiring)
		if d, ok := c.entries[e.key]; ok && d.until.Equal(e.until) {
			delete(c.entries, e.key)
		}
	}
}

// rebuild makes the heap again from the live entries, dropping the stale
// ones: O(n), once per n pushes at least. Called with mu held.
func (c *denyCache) rebuild() {
	c.expiry = c.expiry[:0]
	for key, d := range c.entries {
		c.expiry = append(c.expiry, expiring{key: key, until: d.until})
	}
	heap.Init(&c.expiry)
}

// expiring is when the rejection remembered for key runs out.
type expiring struct {
	key   string
	until time.Time
}

// expiryHeap is a min-heap of expiring by until (container/heap).
type expiryHeap []expiring

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].until.Before(h[j].until) }
func (h expiryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiryHeap) Push(x any)        { *h = append(*h, x.(expiring)) }
func (h *expiryHeap) Pop() any {
	old := *h
	last := old[len(old)-1]
	old[len(old)-1] = expiring{}
	*h = old[:len(old)-1]
	return last
}
