// Package waitroom reads the worker's waiting room of a meter key for the
// operator's tools (the dashboard, throttlectl): who waits, in which flow,
// at which place, and for how long. Safe for concurrent use.
package waitroom

import (
	"cmp"
	"context"
	"slices"
	"strconv"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// Flow is one flow's tasks in a key's waiting room: how many, the
// place of its first in the room's order (1: next), and how long until
// its last is expected to start.
type Flow struct {
	Flow    string `json:"flow"`
	Waiting int    `json:"waiting"`
	First   int    `json:"first"`
	// ExpectedWaitMs is when the flow's last waiter is expected to start,
	// from now: what the room lets out before it, at the policy's rate,
	// after the key's own retry-after, and no sooner than its flow's own
	// limits hold it back until.
	ExpectedWaitMs int64 `json:"expectedWaitMs"`
}

// Read reads the waiting room of a meter key: its waiters in the order the
// room lets them out (start-time fair queueing tags), and returns for each
// flow, by flow, its count, first place and the expected wait of its last
// waiter, and the expected wait of the room's last. The wait of a waiter
// is the key's retry-after plus the units of the waiters before it at the
// policy's interval, or until its flow is no longer held back, whichever
// is later.
func Read(ctx context.Context, client redis.UniversalClient, state string, policy throttle.Policy, retryAfter time.Duration, now time.Time) (Room, error) {
	interval := Interval(policy)
	// One transaction, so that the count and the waiters are of one
	// moment (the keys share the state key's hash tag: one Cluster slot).
	pipe := client.TxPipeline()
	room := pipe.ZCard(ctx, state+keyspace.RoomSuffix)
	aside := pipe.ZCard(ctx, state+keyspace.AsideSuffix)
	entries := pipe.HGetAll(ctx, state+keyspace.WaitersSuffix)
	held := pipe.HGetAll(ctx, state+keyspace.HeldSuffix)
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return Room{}, err
	}
	type waiter struct {
		tag   int64
		units int
		flow  string
	}
	var waiters []waiter
	for _, entry := range entries.Val() {
		if tag, units, flow, ok := keyspace.RoomWaiter(entry); ok {
			waiters = append(waiters, waiter{tag, units, flow})
		}
	}
	slices.SortStableFunc(waiters, func(a, b waiter) int { return cmp.Compare(a.tag, b.tag) })
	byFlow := map[string]*Flow{}
	ahead := 0 // units let out before the waiter
	var last int64
	for i, w := range waiters {
		wait := retryAfter + time.Duration(ahead+w.units-1)*interval
		if until, err := strconv.ParseInt(held.Val()[w.flow], 10, 64); err == nil {
			wait = max(wait, time.UnixMicro(max(until, -until)).Sub(now))
		}
		ahead += w.units
		f := byFlow[w.flow]
		if f == nil {
			f = &Flow{Flow: w.flow, First: i + 1}
			byFlow[w.flow] = f
		}
		f.Waiting++
		f.ExpectedWaitMs = max(f.ExpectedWaitMs, wait.Milliseconds())
		last = max(last, wait.Milliseconds())
	}
	r := Room{Waiting: int(room.Val() + aside.Val()), Flows: make([]Flow, 0, len(byFlow)), ExpectedWait: time.Duration(last) * time.Millisecond}
	for _, f := range byFlow {
		r.Flows = append(r.Flows, *f)
	}
	slices.SortFunc(r.Flows, func(a, b Flow) int { return cmp.Compare(a.Flow, b.Flow) })
	return r, nil
}

// Room is a key's waiting room at one moment.
type Room struct {
	// Waiting counts the tasks in the room (and set aside there).
	Waiting int
	// Flows are its flows, by flow.
	Flows []Flow
	// ExpectedWait is when the room's last waiter is expected to start,
	// from now.
	ExpectedWait time.Duration
}

// Interval is the time between two units of a TokenBucket or GCRA
// policy; 0 for the others.
func Interval(p throttle.Policy) time.Duration {
	var r throttle.Rate
	switch p := p.(type) {
	case throttle.GCRA:
		r = p.Rate
	case throttle.TokenBucket:
		r = p.Rate
	default:
		return 0
	}
	return r.Per / time.Duration(r.N)
}
