package throttle

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/gate"
	"github.com/redis/go-redis/v9"
)

// This file is the line of waiters of a ConcurrencyLimiter key (see
// lua/concurrency.lua): AcquireWait, and what the worker needs of it
// through internal/gate.

func init() {
	gate.CapWait = func(ctx context.Context, limiter any, key, waiter string, budget time.Duration, park *gate.CapParking) (any, int, bool, error) {
		c, ok := limiter.(*ConcurrencyLimiter)
		if !ok {
			return nil, 0, false, fmt.Errorf("%w: %T is not a ConcurrencyLimiter", ErrNotSupported, limiter)
		}
		lease, ahead, parked, err := c.waitObserved(ctx, key, waiter, max(budget, 0), park)
		if lease == nil {
			return nil, ahead, parked, err
		}
		return lease, ahead, false, err
	}
	gate.CapLeave = func(ctx context.Context, limiter any, key, waiter string) error {
		if c, ok := limiter.(*ConcurrencyLimiter); ok {
			return c.leave(ctx, key, waiter)
		}
		return nil
	}
	gate.OnCapCall = func(limiter any, call func(payloads []string), task func(payload string) (string, []string, bool)) {
		if c, ok := limiter.(*ConcurrencyLimiter); ok {
			c.parking.Store(&parking{call: call, task: task})
		}
	}
}

// Suffixes of a concurrency key's line and waiters, in its Cluster slot,
// and of the channels its inline waiters are woken on: one for each
// limiter with waiters, the suffix followed by ":" and the limiter's waker
// token (see waker).
// (waitersSuffix, the waiters' entries, is a room's too.)
const (
	lineSuffix = ":line"
	wakeSuffix = ":wake"
)

// How a waiter in line shows itself: it asks again every lineRefresh (in
// case a wake-up was missed), and its entry lasts lineEntry unless shown
// again.
const (
	lineRefresh = time.Second
	lineEntry   = 3 * time.Second
)

// awayGrace is how much longer than its budget a waiter that the line parks
// when its budget runs out listens for a slot handed to it: a release's
// message published just before Redis parked it still reaches it. (One
// that comes later still reaches the limiter's waker, which calls the
// task back: see waker.away.)
const awayGrace = 100 * time.Millisecond

// callAhead is how far down the line, beyond the slots a release frees,
// parked waiters are called back: a slot's worth of holders, so that a
// called task comes back while the holders ahead of it still run.
func (c *ConcurrencyLimiter) callAhead() int { return c.policy.Limit }

// lineKeys returns the keys of concurrency.lua for key.
func (c *ConcurrencyLimiter) lineKeys(key string) []string {
	holders := c.Key(key)
	return []string{holders, holders + lineSuffix, holders + waitersSuffix}
}

// AcquireWait takes one of key's slots like Acquire, and when all are held
// waits in line for one: waiters get slots in the order they came, across
// every process sharing the Redis, and while anyone waits a caller of
// Acquire gets none. A waiter is woken through Redis's pub/sub as soon as
// a slot is freed for it (and asks again every second in case a message is
// lost). It returns the Lease, or ctx's error when ctx ends first, having
// left the line. Under [FailOpen] a wait Redis cannot answer is granted a
// Degraded lease. Release every Lease, typically with defer.
func (c *ConcurrencyLimiter) AcquireWait(ctx context.Context, key string) (*Lease, error) {
	lease, _, _, err := c.waitObserved(ctx, key, newHolderID(), -1, nil)
	return lease, err
}

// waitObserved is waitInLine, reported to the limiter's metrics and
// Observer as one acquire: admitted with a Lease, throttled when the
// budget ran out first (or the waiter parked), or the error.
func (c *ConcurrencyLimiter) waitObserved(ctx context.Context, key, waiter string, budget time.Duration, park *gate.CapParking) (*Lease, int, bool, error) {
	start := c.began()
	lease, ahead, parked, err := c.waitInLine(ctx, key, waiter, budget, park)
	r := Result{Allowed: lease != nil, Limit: c.policy.Limit}
	if lease != nil {
		r.Degraded = lease.degraded
	}
	c.observe(ctx, OpAcquire, key, 1, start, r, err)
	return lease, ahead, parked, err
}

// waitInLine stands waiter in key's line until it gets a slot, ctx ends or
// budget runs out (a negative budget never does; a waiter called back from
// parking waits without one). On ctx's end it leaves the line; when the
// budget runs out it stays in it and returns a nil Lease: without park,
// the caller leaves (leave). With park, its first call parks it at once
// when it is too far back in line to get a slot within budget, as the
// holds go (see noteHold), and otherwise tells the line its budget, so
// that the line parks it when that runs out: either way it returns parked
// true, and the caller has nothing more to tell Redis (a refresh of its
// place in line, every lineRefresh while the budget lasts, tells it again).
// ahead is how many waited before it at the last look.
func (c *ConcurrencyLimiter) waitInLine(ctx context.Context, key, waiter string, budget time.Duration, park *gate.CapParking) (lease *Lease, ahead int, parked bool, err error) {
	if err := validRequest(key, 1, c.policy.Limit); err != nil {
		return nil, 0, false, err
	}
	var deadline <-chan time.Time
	var deadlineAt time.Time
	if budget >= 0 {
		deadlineAt = time.Now().Add(budget)
		timer := time.NewTimer(budget)
		defer timer.Stop()
		deadline = timer.C
	}
	// deferred: the line parks the waiter when its budget runs out (way
	// 'w' of concurrency.lua), so it returns parked then, with no call.
	deferred := false
	w := c.wakes()
	channel := c.Key(key) + wakeSuffix + ":" + w.token
	woken, leaveChannel := w.join(channel, waiter)
	defer leaveChannel()
	// The holder names the waker (its token, before the "."): the release
	// that hands it a slot tells only this limiter's channel.
	holder := w.token + "." + newHolderID()
	look := itoa(int64(c.look()))
	first := true
	for {
		sent := time.Now()
		args := append([]any{"4", holder}, c.params...)
		args = append(args, itoa(lineEntry.Microseconds()), waiter, look)
		// The first call, and a refresh of a waiter the line is to park,
		// give the budget left: the line parks the waiter when it runs out.
		left := time.Duration(-1)
		if park != nil && budget >= 0 && (first || deferred) {
			left = budget
			if !first {
				// Never negative: a refresh that comes late parks it now.
				left = max(0, time.Until(deadlineAt)-awayGrace)
			}
		}
		first = false
		if left >= 0 {
			args = append(args, itoa(left.Microseconds()), park.Payload, itoa(park.TTL.Microseconds()), c.holdMicros())
		}
		values, err := c.evalReply(ctx, concurrencyScript, c.lineKeys(key), args, true) // acknowledged, as every decision of the limiter
		if err != nil {
			if c.failOpen(ctx, err) {
				return degradedLease(), 0, false, nil
			}
			_ = c.leave(ctx, key, waiter)
			return nil, 0, false, c.unavailable(ctx, err)
		}
		ints, err := intsOf(values, 8)
		if err != nil {
			_ = c.leave(ctx, key, waiter)
			return nil, 0, false, c.unavailable(ctx, err)
		}
		c.noteHeads(key, values)
		if ints[0] == 1 {
			return startLease(c, key, holder, sent), 0, false, nil
		}
		ahead = int(ints[5])
		if ints[7] == 1 {
			return nil, ahead, true, nil
		}
		if ints[6] == 1 {
			deadline = nil // called back: its turn is near
		}
		deferred = ints[7] == 2 // a call without a budget writes it inline again
		if deferred {
			// Redis parks it the budget left after it ran the call: it
			// gives up no sooner, and a little later, for a slot handed to
			// it just before then to reach it.
			deadlineAt = time.Now().Add(left + awayGrace)
			away := time.NewTimer(left + awayGrace)
			defer away.Stop()
			deadline = away.C
		}
		// It asks again every lineRefresh, in case a message was lost, while
		// its budget lasts longer.
		var refreshes <-chan time.Time
		refresh := time.NewTimer(lineRefresh)
		if deadline == nil || time.Until(deadlineAt) > lineRefresh+awayGrace {
			refreshes = refresh.C
		}
		select {
		case <-woken:
			// A release handed it the slot: its lease runs from after this
			// call was sent.
			refresh.Stop()
			return startLease(c, key, holder, sent), 0, false, nil
		case <-refreshes:
		case <-deadline:
			refresh.Stop()
			if deferred && park != nil {
				// Gone back to its queue: a slot handed to it from now on
				// (its message late) has its task called back at once.
				w.away(channel, waiter, func() { c.callParked(park.Payload) })
			}
			leaveChannel() // no signal comes after this
			select {
			case <-woken: // handed the slot as the budget ran out
				w.forget(channel, waiter)
				return startLease(c, key, holder, sent), 0, false, nil
			default:
			}
			return nil, ahead, deferred, nil
		case <-ctx.Done():
			refresh.Stop()
			_ = c.leave(ctx, key, waiter)
			return nil, ahead, false, fmt.Errorf("throttle: %w", ctx.Err())
		}
		refresh.Stop()
	}
}

// leave takes waiter out of key's line, in the background if ctx has
// ended (bounded like every clean-up), and hands the slot it leaves to the
// next in line. Its error is Redis's when the call failed; the callers
// that leave as they fail or give up on a wait have a better one to
// return.
func (c *ConcurrencyLimiter) leave(ctx context.Context, key, waiter string) error {
	err := c.cleanup(ctx, func(ctx context.Context) error {
		_, err := c.freeing(ctx, "6", key, waiter)
		return err
	})
	if err != nil {
		return c.unavailable(ctx, err)
	}
	return nil
}

// release frees holder's slot of key, waking the next in line, and reports
// whether it was still held.
func (c *ConcurrencyLimiter) release(ctx context.Context, key, holder string) (bool, error) {
	ints, err := c.freeing(ctx, modeRelease, key, holder)
	if err != nil {
		return false, err
	}
	return ints[0] == 1, nil
}

// freeing runs a release or leave (mode) of id on key, which may free a
// slot: the next in line are woken, parked waiters called (their tasks
// moved in the same call when prepared for, see prepared), and the reply's
// first five values returned.
func (c *ConcurrencyLimiter) freeing(ctx context.Context, mode, key, id string) ([]int64, error) {
	extraKeys, extraArgs := c.prepared(key)
	args := append([]any{mode, id}, c.params...)
	args = append(append(args, c.Key(key)+wakeSuffix, "", itoa(int64(c.callAhead()))), extraArgs...)
	values, err := c.evalReply(ctx, concurrencyScript, append(c.lineKeys(key), extraKeys...), args, true)
	if err != nil {
		return nil, err
	}
	ints, err := intsOf(values, 5)
	if err != nil {
		return nil, err
	}
	c.called(values)
	return ints, nil
}

// intsOf reads the first n values of a script's reply as integers.
func intsOf(values []any, n int) ([]int64, error) {
	if len(values) < n {
		return nil, fmt.Errorf("script returned %d values, want %d", len(values), n)
	}
	ints := make([]int64, n)
	for i := range ints {
		var err error
		if ints[i], err = asInt(values[i]); err != nil {
			return nil, err
		}
	}
	return ints, nil
}

// wakes returns the limiter's subscriber, made on first use.
func (c *ConcurrencyLimiter) wakes() *waker {
	c.wakerOnce.Do(func() {
		c.waker = &waker{client: c.client, heads: &c.heads, token: newHolderID()[:12], waiters: map[string]map[string]chan struct{}{}}
	})
	return c.waker
}

// A waker is one pub/sub connection per ConcurrencyLimiter, subscribed to
// its own wake channel of each key it has waiters in line for (the key's
// wake channel and its token), so that a release's message reaches only
// the limiter whose waiter it hands a slot, however many processes wait
// on the key; it passes each message on to the waiters it names. A
// channel stays subscribed, and the connection open, for wakerLinger after
// its last waiter left, so that a busy process does not open a connection
// and subscribe for every task that takes a slot.
type waker struct {
	client redis.UniversalClient
	heads  *heads // told by a release's wake-up message (see concurrency.lua)
	token  string // names this waker's channels, and its waiters' holders

	mu         sync.Mutex
	ps         *redis.PubSub
	waiters    map[string]map[string]chan struct{} // channel -> waiter -> its signal: handed a slot
	subscribed map[string]bool                     // channels subscribed to, waited on or lingering
	idle       *time.Timer                         // closes the connection when no waiter came back
	// gone holds, by channel and waiter (goneKey), what
	// calls back the task of a waiter that went back to its queue as the
	// line parked it, for goneKept.
	gone map[string]goneWaiter
}

// goneKey is a gone waiter's key in waker.gone.
func goneKey(channel, waiter string) string { return channel + "\n" + waiter }

// goneWaiter is what calls a gone waiter's task back, and until when.
type goneWaiter struct {
	call  func()
	until time.Time
}

// goneKept is how long a waker remembers a waiter gone back to its queue:
// the line hands it no slot after its budget, awayGrace (100 ms) before it
// stopped listening, so only a message delayed that much comes for it; a
// second is ample.
const goneKept = time.Second

// away remembers that waiter went back to its queue as the line parked it,
// and call, which brings its task back: a slot the line handed it just
// before, whose message comes after it stopped listening, would otherwise
// be held for it until asynq's own retry brought the task back.
func (w *waker) away(channel, waiter string, call func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	for k, g := range w.gone {
		if now.After(g.until) {
			delete(w.gone, k)
		}
	}
	if w.gone == nil {
		w.gone = map[string]goneWaiter{}
	}
	w.gone[goneKey(channel, waiter)] = goneWaiter{call: call, until: now.Add(goneKept)}
}

// forget drops what away remembered of waiter.
func (w *waker) forget(channel, waiter string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.gone, goneKey(channel, waiter))
}

// wakerLinger is how long a waker keeps its connection after its last
// waiter left; wakerChannels is how many channels without waiters it keeps
// subscribed meanwhile (beyond, a channel is left with its last waiter).
const (
	wakerLinger   = 10 * time.Second
	wakerChannels = 256
)

// join subscribes waiter to channel and returns its signal and the function
// that unsubscribes it (again, a no-op).
func (w *waker) join(channel, waiter string) (<-chan struct{}, func()) {
	signal := make(chan struct{}, 1)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.idle != nil {
		w.idle.Stop()
		w.idle = nil
	}
	if w.ps == nil {
		w.ps = w.client.Subscribe(context.Background())
		w.subscribed = map[string]bool{}
		go w.deliver(w.ps)
	}
	if !w.subscribed[channel] {
		_ = w.ps.Subscribe(context.Background(), channel)
		w.subscribed[channel] = true
	}
	if w.waiters[channel] == nil {
		w.waiters[channel] = map[string]chan struct{}{}
	}
	w.waiters[channel][waiter] = signal
	delete(w.gone, goneKey(channel, waiter)) // back: its signal is what hears it
	left := false
	return signal, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if left {
			return
		}
		left = true
		delete(w.waiters[channel], waiter)
		if len(w.waiters[channel]) > 0 {
			return
		}
		delete(w.waiters, channel)
		if len(w.subscribed) > wakerChannels && w.ps != nil {
			_ = w.ps.Unsubscribe(context.Background(), channel)
			delete(w.subscribed, channel)
		}
		if len(w.waiters) == 0 && w.ps != nil && w.idle == nil {
			w.idle = time.AfterFunc(wakerLinger, w.closeIfIdle)
		}
	}
}

// closeIfIdle closes the connection when no waiter joined since the last
// left.
func (w *waker) closeIfIdle() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.waiters) > 0 || w.ps == nil {
		return
	}
	_ = w.ps.Close()
	w.ps, w.subscribed, w.idle = nil, nil, nil
}

// deliver passes ps's messages on until ps is closed.
func (w *waker) deliver(ps *redis.PubSub) {
	for msg := range ps.Channel() {
		ids, heads, listed := strings.Cut(msg.Payload, "\n")
		if listed {
			w.heads.noteMessage(strings.TrimSuffix(msg.Channel, wakeSuffix+":"+w.token), heads)
		}
		var calls []func()
		w.mu.Lock()
		for _, id := range strings.Split(ids, ",") {
			id = strings.TrimPrefix(id, "+")
			if signal, ok := w.waiters[msg.Channel][id]; ok {
				select {
				case signal <- struct{}{}:
				default: // a signal waits already
				}
			} else if g, ok := w.gone[goneKey(msg.Channel, id)]; ok {
				// Handed a slot after it went back: its task is called back.
				delete(w.gone, goneKey(msg.Channel, id))
				if time.Now().Before(g.until) {
					calls = append(calls, g.call)
				}
			}
		}
		w.mu.Unlock()
		for _, call := range calls {
			call()
		}
	}
}
