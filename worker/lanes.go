package worker

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/bounded"
	"github.com/jobthrottle/jobthrottle/internal/gate"
	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/jobthrottle/jobthrottle/internal/scripts"
)

// The lanes in Redis. On one Redis server, a task that books its slot on
// its one rate rule and must come back joins its queue's lane in Redis in
// the call that booked it (meter_start.lua). One dispatcher of the fleet,
// the lane's holder, moves the lane's due tasks to the heads of their
// queues, all of them in one call a turn (lane_poll.lua), so bringing
// tasks back costs the fleet a call per turn, not one a task and process.
// The others look at the lane only when its holder's lease would end, if
// they have tasks in it then, to take it over from a holder that stopped.

var lanePollScript = scripts.Load(scriptFiles, "lua/assembled/lane_poll.lua")

const (
	// laneWindow: a turn moves every task due within it, up to that much
	// early (it waits in its handler for its slot), and turns come no
	// closer than it while tasks are due one after another.
	laneWindow = 100 * time.Millisecond
	// laneGap is the longest between a holder's turns while its lane has
	// tasks: a task another process put in the lane is seen within it.
	laneGap = 250 * time.Millisecond
	// laneLookahead: a turn names the tasks due this soon, whose keys the
	// next turn declares to move them.
	laneLookahead = laneGap + 2*laneWindow
	// laneNamed bounds the tasks a turn names (and the next one moves).
	laneNamed = 64
)

// laneKeysOf returns the keys of queue's lane in Redis and of its holder.
func (t *Throttler) laneKeysOf(queue string) (lane, holder string) {
	lane = t.cfg.prefix + "worker:lane:" + keyspace.Tag(queue)
	return lane, lane + ":holder"
}

// lanePollKeys returns the keys lane_poll.lua declares for queue before
// the tasks it moves: asynq's retry, scheduled and pending keys, the lane
// and its holder.
func (t *Throttler) lanePollKeys(queue string) []string {
	lane, holder := t.laneKeysOf(queue)
	return append(asynqQueueKeys(queue), lane, holder)
}

// laneJoin returns what a task's start needs to join its queue's lane in
// the same call, or nil when the task cannot: it runs outside an asynq
// server, it is to be handed over to a copy of itself, or the rules decide
// on another Redis than asynq's, or on a Cluster (the lane is in the
// queue's slot, the meter's key in its own).
func (t *Throttler) laneJoin(tk *task) *gate.LaneJoin {
	if !t.laneInRedis || tk.queue == "" || tk.id == "" || tk.last {
		return nil
	}
	lane, holder := t.laneKeysOf(tk.queue)
	return &gate.LaneJoin{Lane: lane, Holder: holder, Task: tk.id, Lead: t.laneLead(),
		Dispatcher: t.dispatch.self.ID, Lease: dispatcherLease, Keep: ticketGrace}
}

// joinedLane notes that a task of queue, due, joined its lane, held by
// the holder then: this dispatcher takes a turn at it when it holds the
// lane, and otherwise looks when the holder's lease would end, for as long
// as it has tasks in the lane.
func (t *Throttler) joinedLane(queue string, due time.Time, holder gate.LaneHolder) {
	d, id := &t.dispatch, roomID{key: queue}
	d.mu.Lock()
	if due.After(d.laneTasks[id]) {
		if d.laneTasks == nil {
			d.laneTasks = map[roomID]time.Time{}
		}
		d.laneTasks[id] = due
	}
	// The holder's turns come at least every laneGap: another process's
	// task may be due sooner than this one.
	at := due.Add(-laneWindow)
	if gap := time.Now().Add(laneGap); gap.Before(at) {
		at = gap
	}
	if holder.Holder != d.self.ID {
		at = d.heldElsewhere(id, holder.Until)
	} else {
		delete(d.elsewhere, id)
	}
	d.mu.Unlock()
	t.startDispatcher()
	t.turnAt(0, turn{at: at, queue: queue})
}

// laneTurn takes one turn of queue's lane and returns its next (zero:
// none), or, when another dispatcher holds the lane, when to look again.
func (t *Throttler) laneTurn(ctx context.Context, queue string) time.Time {
	d, id := &t.dispatch, roomID{key: queue}
	named := d.laneNamed[id]
	keys := t.lanePollKeys(queue)
	args := append(make([]any, 0, 6+len(named)), d.self.ID, dispatcherLease.Milliseconds(), time.Now().UnixNano(),
		laneWindow.Milliseconds(), laneLookahead.Milliseconds(), laneNamed)
	for _, task := range named {
		keys = append(keys, asynqTaskKey(queue, task))
		args = append(args, task)
	}
	var reply []any
	err := bounded.Call(ctx, func(ctx context.Context) error {
		var err error
		reply, err = lanePollScript.Run(ctx, t.client, keys, args...).Slice()
		return err
	})
	if err == nil && len(reply) < 3 {
		err = fmt.Errorf("lane_poll.lua returned %d values, want 3 or more", len(reply))
	}
	if err != nil {
		t.failed(ctx, "a turn of its queue's return lane", queue, err)
		return time.Now().Add(100 * time.Millisecond)
	}
	ints := make([]int64, min(len(reply), 4))
	for i := range ints {
		ints[i], _ = reply[i].(int64)
	}
	if ints[0] == 0 {
		// Another dispatcher holds the lane: look again when its lease
		// would end, while this process has tasks in the lane.
		delete(d.laneNamed, id)
		d.mu.Lock()
		defer d.mu.Unlock()
		again := d.heldElsewhere(id, time.UnixMicro(ints[1]))
		if again.After(d.laneTasks[id].Add(laneFallback)) {
			delete(d.laneTasks, id)
			return time.Time{}
		}
		return again
	}
	d.mu.Lock()
	delete(d.elsewhere, id)
	d.mu.Unlock()
	if len(ints) < 4 || ints[2] < 0 {
		delete(d.laneNamed, id) // empty, and given up
		return time.Time{}
	}
	if d.laneNamed == nil {
		d.laneNamed = map[roomID][]string{}
	}
	next := make([]string, 0, len(reply)-4)
	for _, v := range reply[4:] {
		if s, ok := v.(string); ok {
			next = append(next, s)
		}
	}
	d.laneNamed[id] = next
	// The first task left is due in: it may be due already, one this turn
	// could not move, not named before (looked at again at once), or still
	// in its handler (looked at again a window later).
	in := time.Duration(ints[2]*1000-ints[3]) * time.Microsecond
	switch {
	case in <= laneWindow && len(next) > 0 && !slices.Contains(named, next[0]):
		return time.Now().Add(notYetAgain)
	case in <= laneWindow:
		return time.Now().Add(laneWindow)
	case in-laneWindow > laneGap:
		return time.Now().Add(laneGap)
	default:
		return time.Now().Add(max(in-laneWindow, laneWindow))
	}
}

// resignLanes gives up the lanes this dispatcher holds (any it put tasks
// in or took turns of: the script gives a lane up only for its holder), so
// that the next task to join one makes its process the holder.
func (t *Throttler) resignLanes(ctx context.Context) {
	d := &t.dispatch
	d.mu.Lock()
	lanes := map[roomID]time.Time{}
	maps.Copy(lanes, d.laneTasks)
	d.mu.Unlock()
	for id := range d.laneNamed {
		lanes[id] = time.Time{}
	}
	for id := range lanes {
		_ = bounded.Call(ctx, func(ctx context.Context) error {
			return lanePollScript.Run(ctx, t.client, t.lanePollKeys(id.key), d.self.ID, "0", strconv.FormatInt(time.Now().UnixNano(), 10), "0", "0", "0").Err()
		})
	}
	d.laneNamed = nil
}
