package worker

import (
	"context"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/gate"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// task is what the gate knows of the task it decides about.
type task struct {
	*asynq.Task
	id     string // asynq's ID of this message
	origin string // the ID it is known by: its own, or the one it was copied from
	ticket string // names its bookings across attempts, and its place in rooms
	queue  string
	copies int  // hand-over copies made so far
	last   bool // no retries left: asynq would archive a returned error
	keys   []string
	costs  []int // the units it takes under each rule
}

// pass is one attempt to get a task through all its rules. Either it is
// admitted, holding leases, window reservations and meter starts that
// come after delay, or refused is set and it holds nothing.
type pass struct {
	shared   []sharedTake
	leases   []held
	windows  []booking
	starts   []start
	claims   []claimed
	delay    time.Duration // until the latest start
	degraded bool

	refused *refusal
}

// held is a concurrency lease and the rule and key it was taken for.
type held struct {
	*throttle.Lease
	rule *Rule
	key  string
}

// booking is a window reservation and the rule and key it was made for.
type booking struct {
	*throttle.Reservation
	rule *Rule
	key  string
}

// start is a task's admitted start under a meter rule (see internal/gate).
type start struct {
	gate.Start
	rule   *Rule
	key    string
	n      int    // units
	held   int    // where the start's capacity came from
	ticket string // its ticket, or its name in the room
}

// refusal says which rule turned the task away and what it is to do.
type refusal struct {
	rule       *Rule
	key        string
	retryAfter time.Duration
	// how: what the task does about it; see the constants.
	how int
	// leadWait: entering a room (how), the task waits for another meter
	// too, which has no room for this long.
	leadWait time.Duration
	// parked: parking in a cap's line (how), the line parked it (at once,
	// or as its budget ran out); false only where nothing could call it
	// back (see Throttler.parking).
	parked bool
	// entered: entering a room (how), the task's claim put it there
	// already, with waiters in the room then.
	entered bool
	waiters int
	lease   gate.RoomLease // who held the room's dispatcher lease then
	// lane: coming back (how), the lane in Redis the task's start put it
	// in, if it did, and who held the lane then.
	lane gate.LaneHolder
	err  error // set when Redis could not decide
}

// What a refused task does.
const (
	waitOrRetry = iota // wait inline for retryAfter, or go back for it (with a spread)
	enterRoom          // the rule's room decides: wait in it
	comeBack           // the task holds its capacity; its start is retryAfter away
	parkInLine         // the cap's line: park in it, to be called back
)

// unavailableBackoff is how long a task waits before asking again when
// Redis could not decide under fail-closed.
const unavailableBackoff = 5 * time.Second

// How a meter rule treats a task. A task under one meter (TokenBucket or
// GCRA) that does not share its limit fairly books its slot there ahead
// when it must wait, and comes back for it: the lead meter. A task under
// several meters waits in the room of one of them, the room meter (the
// first that shares its limit fairly, see FairBy, or else the second,
// typically the overall limit after a per-key one): the room lets its
// waiters out in turn as its rate allows, and a dispatcher books each
// one's slot on its other meters, the along meters, at the instant of its
// release (see dispatch.go). So capacity is taken on every meter for the
// same instant, and none sits idle ahead on one while another holds the
// task back. A single meter that shares fairly is a room meter too.
const (
	leadMeter = iota + 1
	roomMeter
	alongMeter
	// leasedRate: a rule whose limiter decides from leased shares
	// (throttle.WithLeasedShares), asked before the others, mostly in
	// memory (see takeShares).
	leasedRate
)

// meterRoles returns the role of each of the task's rules that is a meter;
// 0 for the others.
func meterRoles(rules []*Rule) []int {
	roles := make([]int, len(rules))
	var meters []int
	room, changeable := -1, -1
	for i, r := range rules {
		if r.limiter != nil && gate.Leased(r.limiter) {
			roles[i] = leasedRate
			continue
		}
		if r.limiter == nil || !gate.Meter(r.limiter) {
			continue
		}
		meters = append(meters, i)
		switch {
		case r.fair != nil && room < 0:
			// shared fairly: its tasks wait in its room, whatever the
			// order of the rules and whatever else is named (New lets
			// no task match two FairBy rules)
			room = i
		case changeable < 0 && gate.Changeable(r.limiter):
			changeable = i
		}
	}
	if room < 0 {
		// its policy may change: its tasks wait in its room rather than
		// book slots at the policy of today
		room = changeable
	}
	switch {
	case len(meters) == 0:
		return roles
	case room < 0 && len(meters) == 1:
		roles[meters[0]] = leadMeter
		return roles
	case room < 0:
		room = meters[1]
	}
	for _, i := range meters {
		roles[i] = alongMeter
	}
	roles[room] = roomMeter
	return roles
}

// tryPass asks every rule of the task: those of leased shares first (see
// takeShares), then the others, all at once when that takes one round
// trip instead of several (see tryTogether), else in turn: concurrency
// caps first, then windows, then meters. The first refusal gives back
// everything this pass took. budget is how long the task may wait inline
// for its start.
func (t *Throttler) tryPass(ctx context.Context, tk *task, rules []*Rule, roles []int, budget time.Duration) *pass {
	shared, degraded, refused := t.takeShares(ctx, tk, rules, roles)
	if refused != nil {
		return &pass{refused: refused}
	}
	defer (&pass{shared: shared}).onPanic(ctx) // what tryRules took it gives back itself
	p := t.tryRules(ctx, tk, rules, roles, budget)
	if p.refused != nil {
		giveBackShares(shared)
		return p
	}
	p.shared, p.degraded = shared, p.degraded || degraded
	return p
}

// tryRules asks the rules of the task other than those of leased shares.
func (t *Throttler) tryRules(ctx context.Context, tk *task, rules []*Rule, roles []int, budget time.Duration) *pass {
	if p := t.tryTogether(ctx, tk, rules, roles, budget); p != nil {
		return p
	}
	p := &pass{}
	defer p.onPanic(ctx)
	// Concurrency caps: the task waits in the cap's line, inline for as long
	// as its budget allows (woken as soon as a slot is freed for it), and
	// parks beyond that (see parkInLine).
	started := time.Now()
	for i, r := range rules {
		if r.conc == nil {
			continue
		}
		got, _, parked, err := gate.CapWait(ctx, r.conc, tk.keys[i], tk.waiterID(), budget-time.Since(started), t.parking(tk))
		if err != nil {
			return p.refuse(ctx, r, tk.keys[i], unavailableBackoff, waitOrRetry, err)
		}
		if got == nil {
			p.refused = &refusal{rule: r, key: tk.keys[i], how: parkInLine, parked: parked}
			p.giveBack(ctx)
			return p
		}
		lease := got.(*throttle.Lease)
		p.leases = append(p.leases, held{lease, r, tk.keys[i]})
		p.degraded = p.degraded || lease.Degraded()
	}
	budget = max(0, budget-time.Since(started))
	for i, r := range rules {
		if r.limiter == nil || roles[i] != 0 {
			continue
		}
		res, err := r.limiter.Reserve(ctx, tk.keys[i], tk.costs[i], 0)
		if err != nil {
			return p.refuse(ctx, r, tk.keys[i], unavailableBackoff, waitOrRetry, err)
		}
		if !res.OK {
			return p.refuse(ctx, r, tk.keys[i], res.RetryAfter, waitOrRetry, nil)
		}
		p.windows = append(p.windows, booking{res, r, tk.keys[i]})
		p.degraded = p.degraded || res.Degraded
	}
	return t.meterPass(ctx, p, tk, rules, roles, budget, true)
}

// refuse refuses the pass: it gives back what the pass took and records
// why.
func (p *pass) refuse(ctx context.Context, r *Rule, key string, retryAfter time.Duration, how int, err error) *pass {
	p.giveBack(ctx)
	p.refused = &refusal{rule: r, key: key, retryAfter: retryAfter, how: how, err: err}
	return p
}

// meterPass starts the task on its meter rules, if it has any, into p.
// With enter, a task refused by a room's meter enters the room in the
// same call.
func (t *Throttler) meterPass(ctx context.Context, p *pass, tk *task, rules []*Rule, roles []int, budget time.Duration, enter bool) *pass {
	if room := slices.Index(roles, roomMeter); room >= 0 {
		return t.startInRoom(ctx, p, tk, rules, roles, room, budget, enter)
	}
	lead := slices.Index(roles, leadMeter)
	if lead < 0 {
		return p
	}
	r, key := rules[lead], tk.keys[lead]
	req := gate.StartRequest{Key: key, N: tk.costs[lead], MaxWait: budget}
	if tk.ticket != "" {
		// Claims the task's booking, or books one when the meter has no
		// room now.
		req.Held, req.Ticket = gate.HeldByTicket, tk.ticket
		req.BookAhead, req.Grace = r.bookAhead, ticketGrace
		if enter {
			req.Lane = t.laneJoin(tk)
		}
	} else {
		req.BookAhead = budget // outside an asynq server: wait inline
	}
	s, err := gate.StartOn(ctx, r.limiter, req)
	switch {
	case err != nil:
		return p.refuse(ctx, r, key, unavailableBackoff, waitOrRetry, err)
	case s.Status == gate.TooLate || s.Status == gate.Booked:
		p = p.refuse(ctx, r, key, s.Wait, comeBack, nil)
		p.refused.lane = s.Lane
		return p
	case s.Status != gate.Admitted:
		// Beyond BookAhead, or outside an asynq server (no ticket): come
		// back when the meter could have room.
		return p.refuse(ctx, r, key, s.Wait, waitOrRetry, nil)
	}
	p.starts = append(p.starts, start{s, r, key, req.N, req.Held, req.Ticket})
	p.delay = s.Wait
	return p
}

// startInRoom starts a task under several meters (or one that shares
// fairly) at one instant, a slot the room meter admits. A task released
// from the room meter's room holds its slot there, and its along meters'
// slots were booked by its ticket for the same instant; it starts there if
// it comes in time (punctualGrace). A fresh task takes the room meter's
// next start within its budget when nobody waits in the room, and room its
// along meters have then; otherwise it waits in the room: all capacity to
// come is handed out by the room, in its order.
func (t *Throttler) startInRoom(ctx context.Context, p *pass, tk *task, rules []*Rule, roles []int, room int, budget time.Duration, enter bool) *pass {
	roomRule, roomKey := rules[room], tk.keys[room]
	parts := []gate.ClaimPart{{Limiter: roomRule.limiter, Req: gate.ClaimRequest{
		Key: roomKey, N: tk.costs[room], Held: gate.HeldByRoom, Ticket: tk.waiterID(), MaxWait: budget, Grace: punctualGrace}}}
	along := []int{room} // the rule of each part
	for i, r := range rules {
		if roles[i] != alongMeter {
			continue
		}
		areq := gate.ClaimRequest{Key: tk.keys[i], N: tk.costs[i], Grace: punctualGrace}
		if tk.ticket != "" {
			areq.Held, areq.Ticket = gate.HeldByTicket, tk.ticket // booked at its release
		}
		parts, along = append(parts, gate.ClaimPart{Limiter: r.limiter, Req: areq}), append(along, i)
	}
	// One call on one Redis: the room meter's start, then its along
	// meters' at the same slot; a meter that refuses has the ones before
	// it given back, and the task enters the room when it is to wait
	// there (unless the rule may give up on it, which is asked first).
	var entry *gate.Entry
	if enter && tk.queue != "" && tk.id != "" && !roomRule.giveUp.enabled() {
		// (A flow the task has none of fails it when it enters.)
		if e, _, err := t.entryOf(ctx, tk, rules, roles, roomRule, roomKey); err == nil {
			e.Late = t.roomLead()
			entry = &e
		}
	}
	got, err := gate.ClaimAll(ctx, parts, entry)
	if err != nil {
		return p.refuse(ctx, roomRule, roomKey, unavailableBackoff, waitOrRetry, err)
	}
	defer func() {
		if r := p.refused; r != nil && r.how == enterRoom && got.Entered {
			r.entered, r.waiters, r.lease = true, got.Waiters, got.Lease
		}
	}()
	claims := got.Claims
	c := claims[0]
	switch {
	case c.Status == gate.Late:
		// Its slot passed: it waits in the room again, in its place, and is
		// let out no sooner than a full lead from now, which it needs to
		// come back in time. (Let out at once, as the meter has had room
		// since, it would come late again, and again.)
		p.giveBack(ctx)
		p.refused = &refusal{rule: roomRule, key: roomKey, how: enterRoom, leadWait: t.roomLead()}
		return p
	case c.Status != gate.Admitted && c.Status != gate.Taken:
		// Others wait in the room, or no start within the budget: the room
		// decides.
		return p.refuse(ctx, roomRule, roomKey, 0, enterRoom, nil)
	}
	last := claims[len(claims)-1]
	if len(claims) == len(parts) && (last.Status == gate.Admitted || last.Status == gate.Taken) {
		for j, cl := range claims {
			i := along[j]
			p.claims = append(p.claims, claimed{cl, rules[i], tk.keys[i], parts[j].Req.N, parts[j].Req.Held, parts[j].Req.Ticket})
			p.delay = max(p.delay, cl.Wait)
		}
		return p
	}
	// An along meter has no room at the slot; what the others took is
	// given back.
	i := along[len(claims)-1]
	wait := max(0, last.Wait)
	if c.Status == gate.Admitted {
		// Released, but this meter has no room at its slot (its booking
		// was lost): the release is given back to the task, which asks
		// again when the meter has room; by then its slot has passed, and
		// it waits in the room again.
		return p.refuse(ctx, rules[i], tk.keys[i], wait, waitOrRetry, nil)
	}
	// Wait in the room, not to be let out before this meter has room.
	p.giveBack(ctx)
	p.refused = &refusal{rule: roomRule, key: roomKey, how: enterRoom, leadWait: wait}
	return p
}

// punctualGrace is how late after its slot a task released from a room
// may still start: later, its slot is lost and it waits again. A start is
// admitted at its slot on the Redis clock; the handler starts when the
// task has come, at most this much after it.
const punctualGrace = 50 * time.Millisecond

// claimed is a task's start under a meter of a room (see startInRoom).
type claimed struct {
	gate.Claim
	rule   *Rule
	key    string
	n      int // units
	held   int
	ticket string
}

// latest returns when the pass's turn comes on the Redis server's clock,
// its meters' common start, and the rule and key of the start that comes
// last: the cause of its wait. Zero when it has none (a pass of
// concurrency caps and windows only, or one let through degraded).
func (p *pass) latest() (time.Time, cause) {
	var slot time.Time
	var last cause
	for _, s := range p.starts {
		if last.rule == "" || s.At.After(slot) {
			slot, last = s.At, cause{s.rule.name, s.key}
		}
	}
	for _, c := range p.claims {
		if last.rule == "" || c.Slot.After(slot) {
			slot, last = c.Slot, cause{c.rule.name, c.key}
		}
	}
	return slot, last
}

// onPanic, deferred while p holds what it took, gives it back when code of
// the user's run meanwhile (a FairBy or Weights function, an Observer)
// panics, then panics on: asynq recovers the panic, and no cap's slot is
// left held, renewed, by a task that will never release it.
func (p *pass) onPanic(ctx context.Context) {
	if r := recover(); r != nil {
		p.giveBack(context.WithoutCancel(ctx))
		panic(r)
	}
}

// giveBack releases the leases, cancels the window reservations and undoes
// the starts. Each is given back while ctx lives, and in the background
// after it ends (throttle's Release and Cancel are bounded so).
func (p *pass) giveBack(ctx context.Context) {
	giveBackShares(p.shared)
	p.shared = nil
	for _, lease := range p.leases {
		_ = lease.Release(ctx)
	}
	p.leases = nil
	for _, b := range p.windows {
		_ = b.Cancel(ctx)
	}
	p.windows = nil
	for _, s := range p.starts {
		_ = gate.UndoStart(ctx, s.rule.limiter, s.key, s.n, s.held, s.ticket, s.Start)
	}
	p.starts = nil
	for _, c := range p.claims {
		_ = gate.UndoClaim(ctx, c.rule.limiter, c.key, c.n, c.held, c.ticket, c.Claim)
	}
	p.claims = nil
	p.delay = 0
}

// waiterID is the task's name in the rooms it waits in: its ticket, which
// a hand-over copy inherits, or its ID outside an asynq server.
func (tk *task) waiterID() string {
	if tk.ticket != "" {
		return tk.ticket
	}
	return tk.id
}

// comeBackAfter is how long a task refused by a window stays away: the
// refusal's wait plus a random spread of up to as much again (1 s to 30 s),
// so that tasks turned away together do not return together. A task
// refused by a full concurrency cap outside an asynq server (nothing could
// call it back) is asked again after about a second.
func comeBackAfter(r *refusal) time.Duration {
	if r.rule.conc != nil && r.err == nil {
		return time.Second + rand.N(time.Second)
	}
	spread := min(max(r.retryAfter, time.Second), 30*time.Second)
	return r.retryAfter + rand.N(spread)
}
