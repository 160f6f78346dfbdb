package scheduler_test

import (
	"sync"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/scheduler"
)

// fakeClock is a clock a test moves by hand: At's channels receive when
// Advance reaches their time. With an embedded Redis it moves Redis's clock
// too, so that claims expire as the test's time goes by. Safe for
// concurrent use.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []fakeWaiter
	redis   *redistest.Clock // nil: Redis keeps its own time
}

type fakeWaiter struct {
	at time.Time
	ch chan time.Time
}

// newFakeClock returns a clock at start driving every scheduler given,
// and, with an embedded target, the Redis clock with it.
func newFakeClock(t *testing.T, tg *redistest.Target, start time.Time, schedulers ...*scheduler.Scheduler) *fakeClock {
	t.Helper()
	c := &fakeClock{now: start}
	if tg != nil && tg.Mini != nil {
		c.redis = tg.Clock(t)
		c.redis.Set(start)
	}
	for _, s := range schedulers {
		scheduler.SetClock(s, c)
	}
	return c
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) At(t time.Time) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if !t.After(c.now) {
		ch <- c.now
		return ch
	}
	c.waiters = append(c.waiters, fakeWaiter{t, ch})
	return ch
}

// Advance moves the clock by d, Redis's with it, and wakes whoever waits
// for a time it passed.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	if c.redis != nil {
		c.redis.Set(c.now)
	}
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if w.at.After(c.now) {
			kept = append(kept, w)
			continue
		}
		w.ch <- w.at
	}
	c.waiters = kept
}

// Waiting returns how many waits are pending.
func (c *fakeClock) Waiting() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiters)
}

// eventually polls cond until it holds, failing the test after a while:
// for what goroutines the test woke do in Redis and asynq.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after 20 s: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
