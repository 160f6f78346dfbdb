package worker

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/gate"
)

// A room's release, by the dispatcher that holds the room's lease (see
// dispatch.go): it lets the waiters whose turn has come out of the room,
// books their slots on their other rate rules at the same instant, and
// moves their tasks to the heads of their queues.

// releaseFrom lets out of rule's room for key every waiter whose turn has
// come (the first was due at due), moving each to the head of its queue,
// and returns the room's next turn (zero when it is empty). A waiter under
// along meters gets its slot there booked, by its ticket, at the instant of
// its release; when one of them has no room by then, the waiter goes back
// to its place, and its flow is held back until that meter has room.
func (t *Throttler) releaseFrom(ctx context.Context, rule *Rule, key string, due time.Time) time.Time {
	d, room := &t.dispatch, roomID{rule, key}
	holds := d.holds[room]
	defer func() {
		if d.holds == nil {
			d.holds = map[roomID][]gate.Hold{}
		}
		if len(holds) > 0 {
			d.holds[room] = holds
		} else {
			delete(d.holds, room)
		}
	}()
	for range 32 {
		lead := t.laneLead()
		batch := gate.Batch{Prepared: d.prepared[room], Window: releaseWindow, Most: releaseMost}
		first, err := gate.Release(ctx, rule.limiter, key, 1, t.roomLead(), releaseNotice(lead), holds, d.self, batch)
		if err != nil {
			t.failed(ctx, "a waiting room's release (rule "+rule.name+")", key, err)
			return time.Now().Add(100 * time.Millisecond)
		}
		rel := first // the last of the waiters let out
		if rel.Elsewhere {
			// Another dispatcher lets the room's waiters out: look again
			// when its lease ends (a little after, so that a holder that
			// lives renews it first).
			delete(d.leased, room)
			d.mu.Lock()
			defer d.mu.Unlock()
			return d.heldElsewhere(room, rel.Due)
		}
		d.mu.Lock()
		delete(d.elsewhere, room)
		d.mu.Unlock()
		if d.leased == nil {
			d.leased = map[roomID]bool{}
		}
		d.leased[room] = true
		holds = holds[:0]
		d.late.observe(due, time.Now(), lead)
		if !rel.OK {
			return rel.Due
		}
		if d.prepared == nil {
			d.prepared = map[roomID][]*gate.Prepared{}
		}
		d.prepared[room] = d.prepared[room][:0]
		for _, w := range first.Next {
			if prep := t.prepare(w.ID, w.Payload); prep != nil {
				d.prepared[room] = append(d.prepared[room], prep)
			}
		}
		for _, r := range append([]gate.Released{first}, first.More...) {
			rel = r
			if until, held := t.letOut(ctx, rule, key, rel); held && len(holds) < maxHolds {
				// The flow's own limits have no room before until: the
				// room holds it back till then rather than release its
				// next waiter sooner, only to put it back.
				holds = append(holds, gate.Hold{Flow: rel.Flow, Until: until})
			}
		}
		if rel.Due.After(time.Now()) {
			return rel.Due // the meter has no room for the next before then
		}
		due = rel.Due
	}
	return time.Now()
}

// letOut sends a waiter a room let out on its way: a release prepared for
// it booked its along meters and moved its task; otherwise its along
// meters are booked here (put back in the room when one has no room) and
// its task moved beside the next release. It returns until when the
// waiter's flow is to be held back, and whether it is.
func (t *Throttler) letOut(ctx context.Context, rule *Rule, key string, rel gate.Released) (time.Time, bool) {
	d := &t.dispatch
	parts := strings.Split(rel.Payload, "\x1f")
	if len(parts) < 2 || (len(parts)-2)%3 != 0 {
		// Not ours to read (or written by an earlier version, whose along
		// meters came in pairs): the task comes back through asynq's own
		// retry.
		err := gate.LeaveRoom(ctx, rule.limiter, key, rel.Waiter)
		t.notGivenBack(ctx, "an unreadable waiter's place in the waiting room", rule, key, err)
		return time.Time{}, false
	}
	queue, id := parts[0], parts[1]
	if rel.Booked {
		if rel.Moved != laneMoved {
			// Not in asynq's hands yet: moved as soon as it is.
			t.at(turn{at: time.Now().Add(notYetAgain), queue: queue, id: id, gone: 1})
		}
		return time.Time{}, false
	}
	until, ok := t.bookAlong(ctx, rel, parts[2:])
	if !ok {
		err := gate.PutBack(ctx, rule.limiter, key, rel.N, rel, until)
		t.notGivenBack(ctx, "a waiter let out, to its place", rule, key, err)
		return time.Time{}, false
	}
	// The move goes on beside the next release: the dispatcher's round
	// trips in a row are what bounds a room's rate when Redis is slow.
	d.moves.Add(1)
	go func() {
		defer d.moves.Done()
		moved, err := t.move(ctx, queue, id)
		if err != nil || moved[0] != laneMoved {
			// Not in asynq's hands yet (or Redis failed): moved as soon as
			// it is.
			t.at(turn{at: time.Now().Add(notYetAgain), queue: queue, id: id, gone: 1})
		}
	}()
	return until, until.After(rel.Slot)
}

// A release lets out up to releaseMost waiters in one call, those after
// the first as long as their starts are within the lead and releaseWindow
// after it: they come to a worker up to that much earlier than they must,
// and wait there for their slots.
const (
	releaseMost   = 16
	releaseWindow = 500 * time.Millisecond
)

// roomLead is how long before its start a waiter is let out of a room: the
// lane's lead, so that it reaches a worker in time, and the dispatcher's
// recent delay (see lateness), so that a late turn does not eat into it.
// It is at most twice the lane's lead: a released task waits inline for its
// start, and may always wait that long (see admit).
func (t *Throttler) roomLead() time.Duration {
	lead := t.laneLead()
	return lead + min(t.dispatch.late.current(time.Now()), lead)
}

// releaseNotice is the least time between a waiter's release and its
// start, given the lane's lead: the lead less the grace its claim has after
// the start. When a release comes later than its due time anyway (the
// meter had room before anyone asked, or the dispatcher was delayed more
// than it has lately been), the start moves later rather than leave the
// task too little time to travel through asynq, miss its slot by more than
// the grace and wait in the room again.
func releaseNotice(lead time.Duration) time.Duration {
	return max(0, lead-punctualGrace)
}

// maxHolds bounds the holds a room's next release is given.
const maxHolds = 16

// bookAlong books a released waiter's slot on its along meters (rule, key
// and units) at the instant of its release, by its ticket. When one of them
// has no room then, it cancels what it booked and returns false and until
// when the waiter's flow is to be held back. Otherwise it returns true and
// the soonest all of them may have room for the flow's next waiter.
func (t *Throttler) bookAlong(ctx context.Context, rel gate.Released, along []string) (time.Time, bool) {
	var booked []gate.Booking
	var next time.Time
	for i := 0; i+2 < len(along); i += 3 {
		r := t.rule(along[i])
		units, err := strconv.Atoi(along[i+2])
		if r == nil || r.limiter == nil || err != nil {
			continue // a rule this process does not know: its claim decides
		}
		// No slack: its starts are taken at one instant.
		b, err := gate.BookAt(ctx, r.limiter, along[i+1], rel.Waiter, units, rel.Slot, 0, ticketGrace)
		if err == nil && b.OK {
			booked = append(booked, b)
			if b.Next.After(next) {
				next = b.Next
			}
			continue
		}
		for _, b := range booked {
			_ = b.Cancel(ctx)
		}
		if err != nil {
			return time.Now().Add(100 * time.Millisecond), false
		}
		return rel.Slot.Add(b.RetryAfter), false
	}
	return next, true
}

// prepare returns what a release needs to book the waiter with payload
// on its along meters and move its task in the same call (see
// gate.Prepared), or nil: no waiter, a payload not ours to read, a rule
// this process does not know, or rules that decide on another Redis than
// asynq's.
func (t *Throttler) prepare(waiter, payload string) *gate.Prepared {
	parts := strings.Split(payload, "\x1f")
	if waiter == "" || !t.sameRedis || len(parts) < 2 || (len(parts)-2)%3 != 0 {
		return nil
	}
	queue, id := parts[0], parts[1]
	p := &gate.Prepared{Waiter: waiter, TaskID: id, TaskKeys: laneKeys(queue, []string{id}), Grace: ticketGrace}
	for i := 2; i+2 < len(parts); i += 3 {
		r := t.rule(parts[i])
		units, err := strconv.Atoi(parts[i+2])
		if r == nil || r.limiter == nil || err != nil {
			return nil
		}
		p.Along = append(p.Along, gate.AlongPart{Limiter: r.limiter, Key: parts[i+1], N: units})
	}
	return p
}

// rule returns the Throttler's rule named name, or nil.
func (t *Throttler) rule(name string) *Rule {
	for i := range t.rules {
		if t.rules[i].name == name {
			return &t.rules[i]
		}
	}
	return nil
}
