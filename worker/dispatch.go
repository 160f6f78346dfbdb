package worker

import (
	"container/heap"
	"context"
	crand "crypto/rand"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/gate"
	"github.com/jobthrottle/jobthrottle/internal/ratelog"
)

// The dispatcher brings tasks back from asynq at their turn: it moves a
// task sent back through the return lane to the head of its queue at its
// turn, and lets the waiters of a room out as its meter allows. Every
// Throttler that has sent a task back runs one, in the background, on the
// turns it knows of: those of the tasks it sent back itself and of the
// rooms it put waiters in. One dispatcher of the fleet at a time lets a
// room's waiters out: the one holding the room's lease, which each of its
// releases renews (dispatcherLease) and the release that finds the room
// empty ends. The others look again when the lease ends, and take the room
// over if its holder has stopped; a Throttler closed gives its leases up.
// If every process stops, asynq's own retry brings their tasks back a
// little late, at the tail of their queues, and a room's turns are taken
// up again when one of its waiters comes back so (see wait).

// turn is one thing the dispatcher does at a time: move a task of a lane,
// or let waiters out of a room.
type turn struct {
	at    time.Time
	queue string // a lane's task: its queue and asynq ID
	id    string
	rule  *Rule // a room: its rule and key
	key   string
	// gone counts the looks that found a task released from a room, or
	// called back from a cap's line, not (yet) in asynq: a hand-over copy
	// is enqueued just after its entry names it. 0: not looked for again.
	gone int
}

// room returns the room or lane whose turn tn is, and whether it is one:
// a turn of a room, or of a queue's lane in Redis (no rule, no task).
func (tn turn) room() (roomID, bool) {
	if tn.rule != nil {
		return roomID{tn.rule, tn.key}, true
	}
	return roomID{key: tn.queue}, tn.id == ""
}

// turns is a min-heap of turns by time (container/heap).
type turns []turn

func (h turns) Len() int           { return len(h) }
func (h turns) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h turns) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *turns) Push(x any)        { *h = append(*h, x.(turn)) }
func (h *turns) Pop() any {
	old := *h
	last := old[len(old)-1]
	*h = old[:len(old)-1]
	return last
}

// dispatcher is the Throttler's background loop and what it knows.
type dispatcher struct {
	once      sync.Once
	closeOnce sync.Once
	stop      chan struct{}
	stopped   chan struct{}
	wake      chan struct{}

	mu     sync.Mutex
	turns  turns
	rooms  map[roomID]time.Time // rooms with a turn in turns, and when
	closed bool

	late  lateness       // how late its rooms' releases have lately been
	moves sync.WaitGroup // released tasks being moved to their queues' heads
	// holds are the flows each room is to hold back at its next release,
	// learned from the bookings of its last ones; the dispatcher's loop
	// alone uses them.
	holds map[roomID][]gate.Hold
	// self names this dispatcher in the rooms' leases; leased are the rooms
	// whose lease it last held (the loop's alone until it has stopped).
	self   gate.Dispatcher
	leased map[roomID]bool
	// prepared: the waiters each room is likely to let out next, which its
	// release books and moves itself (the loop's alone).
	prepared map[roomID][]*gate.Prepared
	// elsewhere: rooms and lanes another dispatcher holds, and till when
	// (under mu).
	elsewhere map[roomID]time.Time
	// laneTasks: the lanes in Redis this process put tasks in, and when
	// the last of them is due (under mu); laneNamed: the lanes this
	// dispatcher holds, and the tasks due soon that their last turn named
	// (the loop's alone until it has stopped). A lane's roomID has no rule.
	laneTasks map[roomID]time.Time
	laneNamed map[roomID][]string
	// failures: the dispatcher's calls Redis failed, logged at most once
	// per failureLogEvery (see failed).
	failures ratelog.Every
}

// failureLogEvery is the least time between two logs of the dispatcher's
// failed calls.
const failureLogEvery = 10 * time.Second

// failed logs a call of the dispatcher that Redis failed (what: a room's
// release, a lane's turn, a move of tasks), at Warn and at most once every
// failureLogEvery, with the count of those not logged since. The
// dispatcher tries again in 100 ms; meanwhile the tasks it would bring
// back come back by asynq's own retry, later and at the tail of their
// queue.
func (t *Throttler) failed(ctx context.Context, what, key string, err error) {
	if ctx.Err() != nil {
		return // stopping: Close
	}
	ok, suppressed := t.dispatch.failures.Allow(time.Now(), failureLogEvery)
	if !ok {
		return
	}
	t.logger().LogAttrs(ctx, slog.LevelWarn, "worker: redis failed "+what+"; trying again in 100ms",
		slog.String("key", key), slog.Int("failures_not_logged", suppressed), slog.Any("error", err))
}

// dispatcherLease is how long a dispatcher keeps a room's lease after its
// last release (unless that release found the room empty): the longest a
// room waits for another dispatcher when its holder stops without Close;
// the other dispatchers with waiters in the room look once per lease.
const dispatcherLease = 5 * time.Second

type roomID struct {
	rule *Rule
	key  string
}

// notYetAgain is how soon a task not yet in asynq's hands is tried again.
const notYetAgain = 20 * time.Millisecond

// releasedGoneLooks is how many times a task released from a room is
// looked for when asynq does not know it (a second's worth): a hand-over
// copy may be enqueued a moment after its release.
const releasedGoneLooks = 50

// at queues a turn and wakes the loop if it is the soonest. A room already
// due sooner keeps its turn.
func (t *Throttler) at(tn turn) { t.turnAt(0, tn) }

// turnAt queues tns at once, in their order (a nanosecond apart, however
// the heap breaks ties), and wakes the loop when one of them is the
// soonest. A room's turn gives way to one already queued no later than
// slack after it.
func (t *Throttler) turnAt(slack time.Duration, tns ...turn) {
	d := &t.dispatch
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return
	}
	now := time.Now()
	pushed, soonest := false, false
	for i, tn := range tns {
		if tn.at.Before(now) {
			tn.at = now // due at once: what came before is not the dispatcher's delay
		}
		tn.at = tn.at.Add(time.Duration(i))
		if id, ok := tn.room(); ok {
			if until := d.elsewhere[id]; tn.at.Before(until) {
				tn.at = until // another dispatcher lets its waiters out
			}
			if due, ok := d.rooms[id]; ok && !due.After(tn.at.Add(slack)) {
				continue
			}
			if d.rooms == nil {
				d.rooms = map[roomID]time.Time{}
			}
			d.rooms[id] = tn.at
		}
		heap.Push(&d.turns, tn)
		pushed, soonest = true, soonest || d.turns[0].at.Equal(tn.at)
	}
	d.mu.Unlock()
	if !pushed {
		return
	}
	t.startDispatcher()
	if soonest {
		select {
		case d.wake <- struct{}{}:
		default:
		}
	}
}

// heardOfLease notes who held rule's room for key when a waiter entered
// it: while another dispatcher's lease lasts, this one does not ask the
// room itself (a release would let nobody out), and every waiter that
// enters meanwhile tells it the lease's new end. A lease that nobody
// holds, or this dispatcher does, clears what it heard before: the room's
// turns come when its waiters are due.
func (t *Throttler) heardOfLease(rule *Rule, key string, lease gate.RoomLease) {
	d, room := &t.dispatch, roomID{rule, key}
	d.mu.Lock()
	defer d.mu.Unlock()
	if lease.Holder == "" || lease.Holder == d.self.ID {
		delete(d.elsewhere, room)
		return
	}
	d.heldElsewhere(room, lease.Until)
}

// heldElsewhere notes that another dispatcher holds room's lease until end,
// and returns when this one looks again: a little after the end, so that a
// holder that lives renews it first. d.mu is held.
func (d *dispatcher) heldElsewhere(room roomID, end time.Time) time.Time {
	again := end.Add(50*time.Millisecond + rand.N(50*time.Millisecond))
	if d.elsewhere == nil {
		d.elsewhere = map[roomID]time.Time{}
	}
	d.elsewhere[room] = again
	return again
}

// startDispatcher starts the dispatcher, once.
func (t *Throttler) startDispatcher() {
	t.dispatch.once.Do(func() {
		t.dispatch.stop = make(chan struct{})
		t.dispatch.stopped = make(chan struct{})
		t.dispatch.wake = make(chan struct{}, 1)
		go t.dispatchLoop()
	})
}

// dispatchLoop serves the turns until Close.
func (t *Throttler) dispatchLoop() {
	d := &t.dispatch
	defer close(d.stopped)
	defer d.moves.Wait()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-d.stop
		cancel()
	}()
	for ctx.Err() == nil {
		t.serveAll(ctx, t.due(time.Now()))
		next := time.Now().Add(time.Hour)
		d.mu.Lock()
		if len(d.turns) > 0 && d.turns[0].at.Before(next) {
			next = d.turns[0].at
		}
		d.mu.Unlock()
		timer := time.NewTimer(time.Until(next))
		select {
		case <-ctx.Done():
		case <-timer.C:
		case <-d.wake:
		}
		timer.Stop()
	}
}

// due takes the turns that have come.
func (t *Throttler) due(now time.Time) []turn {
	d := &t.dispatch
	d.mu.Lock()
	defer d.mu.Unlock()
	var out, later []turn
	for len(d.turns) > 0 && !d.turns[0].at.After(now) {
		tn := heap.Pop(&d.turns).(turn)
		if id, ok := tn.room(); ok {
			due, ok := d.rooms[id]
			if !ok || !due.Equal(tn.at) {
				continue // superseded by a sooner turn of the same room
			}
			if until := d.elsewhere[id]; until.After(now) {
				// Another dispatcher's lease, heard of since the turn was
				// queued, lasts longer: look when it ends.
				tn.at, d.rooms[id] = until, until
				later = append(later, tn)
				continue
			}
			delete(d.rooms, id)
		}
		out = append(out, tn)
	}
	for _, tn := range later {
		heap.Push(&d.turns, tn)
	}
	return out
}

// serveAll does the turns that have come, in order, but for the task moves
// of one queue, done together in one call where the first of them came.
func (t *Throttler) serveAll(ctx context.Context, tns []turn) {
	var moves map[string][]turn
	for _, tn := range tns {
		if tn.rule == nil && tn.id != "" {
			if moves == nil {
				moves = map[string][]turn{}
			}
			moves[tn.queue] = append(moves[tn.queue], tn)
		}
	}
	for _, tn := range tns {
		if tn.rule != nil || tn.id == "" {
			t.serve(ctx, tn)
		} else if group := moves[tn.queue]; group != nil {
			delete(moves, tn.queue)
			t.serveMoves(ctx, group)
		}
	}
}

// serveMoves moves the tasks of tns, all of one queue, to its head in one
// call, the first of them nearest it. A task not yet in asynq's hands is
// looked for again soon, and less often as it stays away (a task called
// back while its handler ends, or not yet handed to asynq).
func (t *Throttler) serveMoves(ctx context.Context, tns []turn) {
	ids := make([]string, len(tns))
	for i, tn := range tns {
		ids[i] = tn.id
	}
	results, err := t.move(ctx, tns[0].queue, ids...)
	if err != nil {
		t.failed(ctx, "a move of tasks to their queue's head", tns[0].queue, err)
	}
	for i, tn := range tns {
		moved := laneNotYet
		if err == nil {
			moved = results[i]
		}
		if moved == laneGone && tn.gone > 0 && tn.gone < releasedGoneLooks {
			tn.gone++
			moved = laneNotYet
		}
		if moved != laneNotYet {
			continue
		}
		tn.at = time.Now().Add(min(notYetAgain<<min(max(tn.gone-1, 0), 3), 8*notYetAgain))
		if err != nil {
			tn.at = time.Now().Add(100 * time.Millisecond)
		}
		t.at(tn)
	}
}

// serve does one turn of a room or a lane (serveAll serves task moves).
func (t *Throttler) serve(ctx context.Context, tn turn) {
	if tn.rule == nil && tn.id == "" {
		if next := t.laneTurn(ctx, tn.queue); !next.IsZero() {
			t.at(turn{at: next, queue: tn.queue})
		}
		return
	}
	if next := t.releaseFrom(ctx, tn.rule, tn.key, tn.at); !next.IsZero() {
		t.at(turn{at: next, rule: tn.rule, key: tn.key})
	}
}

// laneLead is how long before its turn a task is moved to the head of its
// queue: an idle worker's longest sleep between looks at its queues (1.5 ×
// TaskCheckInterval) and a little for the move itself.
func (t *Throttler) laneLead() time.Duration {
	return time.Duration(t.poll.Load())*3/2 + 50*time.Millisecond
}

// Close stops the Throttler's dispatcher, which runs in the background once
// the Throttler has sent a task back, and waits until it has stopped or ctx
// ends. Tasks it would have brought back return through asynq's own retry
// a little later (see the package documentation), or through another
// process's dispatcher. Close is idempotent; a Throttler used after Close
// sends tasks back without a dispatcher.
func (t *Throttler) Close(ctx context.Context) error {
	d := &t.dispatch
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	d.once.Do(func() {}) // none started: none will be
	if d.stop == nil {
		return nil
	}
	d.closeOnce.Do(func() { close(d.stop) })
	select {
	case <-d.stopped:
	case <-ctx.Done():
		return ctx.Err()
	}
	// The rooms this dispatcher let waiters out of, and the lanes it moved
	// tasks of, are another's at once.
	for room := range d.leased {
		err := gate.Resign(ctx, room.rule.limiter, room.key, d.self)
		t.notGivenBack(ctx, "the waiting room's lease", room.rule, room.key, err)
	}
	d.leased = nil
	t.resignLanes(ctx)
	return nil
}

// dispatcherID returns a name for a Throttler's dispatcher unique in the
// fleet: its host, its process and a random part.
func dispatcherID() string {
	host, _ := os.Hostname()
	var b [6]byte
	_, _ = crand.Read(b[:])
	return fmt.Sprintf("%s/%d/%x", host, os.Getpid(), b)
}
