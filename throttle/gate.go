package throttle

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/gate"
	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/redis/go-redis/v9"
)

// This file serves package worker through internal/gate: the strict start
// of a task under a meter rule, and a meter key's waiting room. Neither is
// part of the Limiter's own API.

var (
	meterStartScript = limiterScript("meter_start")
	meterClaimScript = limiterScript("meter_claim")
	roomScript       = limiterScript("room")
)

// Suffixes of the keys the worker keeps beside a meter key's state, in its
// Cluster slot: when tasks started, and the waiting room.
const (
	startsSuffix  = ":starts"
	roomSuffix    = keyspace.RoomSuffix
	waitersSuffix = keyspace.WaitersSuffix
	flowsSuffix   = ":flows"
	heldSuffix    = keyspace.HeldSuffix
	asideSuffix   = keyspace.AsideSuffix
	// the dispatcher that lets the room's waiters out, by lease
	dispatcherSuffix = ":dispatcher"
)

// roomLifetime is how long a room's keys outlive their last write.
const roomLifetime = 24 * time.Hour

func init() {
	gate.Meter = func(limiter any) bool {
		l, ok := limiter.(*Limiter)
		return ok && l.spec.reservable && l.shares == nil
	}
	gate.Leased = func(limiter any) bool {
		l, ok := limiter.(*Limiter)
		return ok && l.shares != nil
	}
	gate.GiveBackLeased = func(limiter any, key string, n int) {
		if l, ok := limiter.(*Limiter); ok && l.shares != nil {
			l.shares.giveBack(key, n)
		}
	}
	gate.Changeable = func(limiter any) bool {
		l, ok := limiter.(*Limiter)
		return ok && l.live != nil
	}
	gate.StartOn = startOn
	gate.UndoStart = undoStart
	gate.ClaimAll = claimAll
	gate.UndoClaim = undoClaim
	gate.EnterRoom = enterRoom
	gate.Release = release
	gate.LeaveRoom = leaveRoom
	gate.Resign = resign
	gate.PutBack = putBack
	gate.BookAt = func(ctx context.Context, limiter any, key, id string, n int, at time.Time, slack, grace time.Duration) (gate.Booking, error) {
		l, err := meterOf(limiter)
		if err != nil {
			return gate.Booking{}, err
		}
		began := l.began()
		res, err := l.book(ctx, key, ticket{ID: id, Grace: grace, at: at.UnixMicro()}, n, slack)
		if err != nil {
			return gate.Booking{}, err
		}
		// The booking of a waiter's slot on one of its other rules, at its
		// release: a refusal is the rule's decision for the task now; a
		// booking made is reported when the task starts by it (its claim),
		// so that a task late for its slot and booked again counts once.
		if l.cfg.observer != nil && !res.OK {
			if sp, err := l.specFor(ctx, key); err == nil {
				l.observe(ctx, OpReserve, key, n, began, Result{Allowed: false, RetryAfter: res.RetryAfter, policy: sp}, nil)
			}
		}
		b := gate.Booking{OK: res.OK, RetryAfter: res.RetryAfter, Cancel: res.Cancel}
		if res.OK {
			b.Slot, b.Next = res.slot, res.nextRoom()
		}
		return b, nil
	}
	gate.ReserveFor = func(ctx context.Context, limiter any, key string, t gate.Ticket, n int, maxDelay time.Duration) (gate.Booking, error) {
		l, ok := limiter.(*Limiter)
		if !ok {
			return gate.Booking{}, fmt.Errorf("%w: %T is not a *Limiter", ErrNotSupported, limiter)
		}
		res, err := l.reserveFor(ctx, key, ticket{ID: t.ID, Grace: t.Grace, NotBefore: t.NotBefore}, n, maxDelay)
		if err != nil {
			return gate.Booking{}, err
		}
		return gate.Booking{OK: res.OK, Slot: res.slot, StartAt: res.StartAt, RetryAfter: res.RetryAfter, Cancel: res.Cancel}, nil
	}
	gate.UsedByRule = func(limiter any, rule string) {
		var c *conn
		switch l := limiter.(type) {
		case *Limiter:
			c = &l.conn
		case *ConcurrencyLimiter:
			c = &l.conn
		}
		if c != nil && c.registry != nil {
			c.registry.addRule(rule)
		}
	}
	gate.ClientOf = func(limiter any) any {
		switch l := limiter.(type) {
		case *Limiter:
			return l.client
		case *ConcurrencyLimiter:
			return l.client
		}
		return nil
	}
}

// meterOf returns limiter as a meter Limiter.
func meterOf(limiter any) (*Limiter, error) {
	l, ok := limiter.(*Limiter)
	if !ok || !l.spec.reservable {
		return nil, fmt.Errorf("%w: %T is not a TokenBucket or GCRA limiter", ErrNotSupported, limiter)
	}
	return l, nil
}

// startKeys returns the keys of meter_start.lua for a request.
func (l *Limiter) startKeys(key string, held int, ticket string) []string {
	state := l.Key(key)
	keys := []string{state, state + startsSuffix, blockKey(state)}
	switch held {
	case gate.HeldByTicket:
		keys = append(keys, ticketKey(state, ticket), state+keyspace.TicketsSuffix)
	case gate.HeldByRoom:
		keys = append(keys, state+waitersSuffix, state+roomSuffix, state+asideSuffix)
	}
	return keys
}

// meterArgs returns n and the policy's parameters as script arguments.
func (sp *spec) meterArgs(n int) []any {
	return append([]any{boxedN(n)}, sp.args...) // burst, num, den
}

// meterFor returns limiter as a meter Limiter and the spec of its policy
// in force for key.
func meterFor(ctx context.Context, limiter any, key string) (*Limiter, *spec, error) {
	l, err := meterOf(limiter)
	if err != nil {
		return nil, nil, err
	}
	sp, err := l.specFor(ctx, key)
	return l, sp, err
}

func startOn(ctx context.Context, limiter any, req gate.StartRequest) (gate.Start, error) {
	l, sp, err := meterFor(ctx, limiter, req.Key)
	if err != nil {
		return gate.Start{}, err
	}
	began := l.began()
	s, err := l.start(ctx, sp, req)
	// One decision per call: admitted when the task starts (by its booking
	// or at once), throttled when it may not yet (it booked a slot ahead,
	// or it must come back): an operator counts the tasks held back, and
	// each task's start once.
	l.observeGate(ctx, req.Key, req.N, began, sp, s.Status == gate.Admitted, s.At, err)
	return s, err
}

// observeGate reports a task's start or claim on a meter to the limiter's
// observer as one decision: admitted when the task may start (at at),
// throttled when it may not yet.
func (l *Limiter) observeGate(ctx context.Context, key string, n int, began time.Time, sp *spec, admitted bool, at time.Time, err error) {
	r := Result{Allowed: admitted, policy: sp}
	if admitted && !at.IsZero() {
		r.serverTime = at.UnixMicro()
	}
	l.observe(ctx, OpAllow, key, n, began, r, err)
}

func (l *Limiter) start(ctx context.Context, sp *spec, req gate.StartRequest) (gate.Start, error) {
	if err := validRequest(req.Key, req.N, sp.capacity); err != nil {
		return gate.Start{}, err
	}
	if req.Held == gate.HeldByRoom {
		return gate.Start{}, fmt.Errorf("%w: a start from a room is claimed (gate.ClaimAll)", ErrNotSupported)
	}
	args := append([]any{"0"}, sp.meterArgs(req.N)...)
	args = append(args, strconv.Itoa(req.Held), "", itoa(sp.ticks(req.NotBefore)), itoa(sp.ticks(req.MaxWait)),
		itoa(sp.ticks(req.BookAhead)), itoa(sp.ticks(req.Grace)))
	keys := l.startKeys(req.Key, req.Held, req.Ticket)
	if j := req.Lane; j != nil && req.Held == gate.HeldByTicket {
		keys = append(keys, j.Lane, j.Holder)
		args = append(args, j.Task, j.Lead.Microseconds(), j.Dispatcher, j.Lease.Milliseconds(), j.Keep.Milliseconds())
	}
	values, err := l.evalValues(ctx, meterStartScript, keys, args)
	if err != nil {
		return gate.Start{}, l.unavailable(ctx, err)
	}
	if len(values) < 7 {
		return gate.Start{}, l.unavailable(ctx, fmt.Errorf("meter_start.lua returned %d values, want 7", len(values)))
	}
	ints := make([]int64, 7)
	for i := range ints {
		if ints[i], err = asInt(values[i]); err != nil {
			return gate.Start{}, l.unavailable(ctx, err)
		}
	}
	s := gate.Start{Status: int(ints[0]), Wait: micros(ints[1])}
	if len(values) >= 9 {
		holder, _ := values[7].(string)
		until, err := asInt(values[8])
		if err != nil {
			return gate.Start{}, l.unavailable(ctx, err)
		}
		s.Lane = gate.LaneHolder{Joined: true, Holder: holder, Until: time.UnixMicro(until)}
	}
	if s.Status == gate.Admitted {
		s.At = time.UnixMicro(ints[6] + ints[1])
		s.Undo = []string{itoa(ints[2]), itoa(ints[3]), itoa(ints[4]), itoa(ints[5])}
	}
	return s, nil
}

func undoStart(ctx context.Context, limiter any, key string, n int, held int, waiter string, s gate.Start) error {
	l, sp, err := meterFor(ctx, limiter, key)
	if err != nil {
		return err
	}
	if s.Status != gate.Admitted || len(s.Undo) != 4 {
		return nil
	}
	args := append([]any{"1"}, sp.meterArgs(n)...)
	args = append(args, strconv.Itoa(held), "", s.Undo[0], s.Undo[1], s.Undo[2], s.Undo[3])
	err = l.cleanup(ctx, func(ctx context.Context) error {
		_, err := l.evalValues(ctx, meterStartScript, l.startKeys(key, held, waiter), args)
		return err
	})
	if err != nil {
		return l.unavailable(ctx, err)
	}
	return nil
}

func (l *Limiter) claim(ctx context.Context, sp *spec, req gate.ClaimRequest) (gate.Claim, error) {
	if err := validRequest(req.Key, req.N, sp.capacity); err != nil {
		return gate.Claim{}, err
	}
	args := append([]any{"0"}, claimArgs(sp, req)...)
	values, err := l.evalValues(ctx, meterClaimScript, l.startKeys(req.Key, req.Held, req.Ticket), args)
	if err != nil {
		return gate.Claim{}, l.unavailable(ctx, err)
	}
	c, err := claimOf(values)
	if err != nil {
		return gate.Claim{}, l.unavailable(ctx, err)
	}
	return c, nil
}

// claimArgs returns meter_claim.lua's arguments for req, but its mode.
func claimArgs(sp *spec, req gate.ClaimRequest) []any {
	var at int64
	if !req.At.IsZero() {
		at = req.At.UnixMicro()
	}
	args := sp.meterArgs(req.N)
	return append(args, strconv.Itoa(req.Held), req.Ticket, itoa(at), itoa(sp.ticks(req.MaxWait)), itoa(req.Grace.Microseconds()),
		itoa(roomLifetime.Microseconds()))
}

// claimOf reads the six values meter_claim.lua returns for a claim.
func claimOf(values []any) (gate.Claim, error) {
	if len(values) < 6 {
		return gate.Claim{}, fmt.Errorf("meter_claim.lua returned %d values, want 6", len(values))
	}
	ints := make([]int64, 5)
	for i := range ints {
		var err error
		if ints[i], err = asInt(values[i]); err != nil {
			return gate.Claim{}, err
		}
	}
	release, _ := values[5].(string)
	c := gate.Claim{Status: int(ints[0])}
	if ints[1] > 0 {
		c.Slot = time.UnixMicro(ints[1])
		c.Wait = micros(ints[1] - ints[2])
	}
	switch c.Status {
	case gate.Taken:
		c.Undo = []string{itoa(ints[3]), itoa(ints[4]), ""}
	case gate.Admitted:
		c.Undo = []string{"0", "0", release}
	}
	return c, nil
}

func undoClaim(ctx context.Context, limiter any, key string, n int, held int, waiter string, c gate.Claim) error {
	l, sp, err := meterFor(ctx, limiter, key)
	if err != nil {
		return err
	}
	if len(c.Undo) != 3 || (c.Undo[0] == "0" && c.Undo[2] == "") {
		return nil
	}
	args := append([]any{"1"}, sp.meterArgs(n)...)
	args = append(args, strconv.Itoa(held), waiter, c.Undo[0], c.Undo[1], c.Undo[2], itoa(roomLifetime.Microseconds()))
	err = l.cleanup(ctx, func(ctx context.Context) error {
		_, err := l.evalValues(ctx, meterClaimScript, l.startKeys(key, held, waiter), args)
		return err
	})
	if err != nil {
		return l.unavailable(ctx, err)
	}
	return nil
}

// roomKeys returns the keys of room.lua for a meter key.
func (l *Limiter) roomKeys(key string) []string {
	state := l.Key(key)
	return []string{state, state + roomSuffix, state + waitersSuffix, state + flowsSuffix, state + heldSuffix, state + asideSuffix}
}

func enterRoom(ctx context.Context, limiter any, key, waiter, flow string, weight, n int, after time.Duration, payload string) (int, gate.RoomLease, error) {
	l, err := meterOf(limiter)
	if err != nil {
		return 0, gate.RoomLease{}, err
	}
	switch {
	case key == "" || waiter == "" || flow == "":
		return 0, gate.RoomLease{}, fmt.Errorf("%w: a room needs a key, a waiter and a flow", ErrInvalidKey)
	case weight < 0:
		return 0, gate.RoomLease{}, fmt.Errorf("%w: a flow's weight must not be negative, got %d", ErrInvalidN, weight)
	case n < 1:
		return 0, gate.RoomLease{}, fmt.Errorf("%w: a waiter takes at least 1 unit, got %d", ErrInvalidN, n)
	}
	args := []any{"0", waiter, flow, strconv.Itoa(weight), itoa(max(0, after.Microseconds())), payload, itoa(roomLifetime.Microseconds()), strconv.Itoa(n)}
	state := l.Key(key)
	keys := append(l.roomKeys(key), state+startsSuffix, state+dispatcherSuffix)
	values, err := l.evalValues(ctx, roomScript, keys, args)
	if err == nil && len(values) != 5 {
		err = fmt.Errorf("room.lua returned %d values to enter, want 5", len(values))
	}
	var size int64
	var lease gate.RoomLease
	if err == nil {
		size, err = asInt(values[0])
	}
	if err == nil {
		lease, err = roomLeaseOf(values[3:])
	}
	if err != nil {
		return 0, gate.RoomLease{}, l.unavailable(ctx, err)
	}
	return int(size), lease, nil
}

// roomLeaseOf reads a room's dispatcher lease from a script's reply: its
// holder and end, us.
func roomLeaseOf(values []any) (gate.RoomLease, error) {
	holder, ok := values[0].(string)
	if !ok {
		return gate.RoomLease{}, fmt.Errorf("a room's lease holder is %T, want a string", values[0])
	}
	until, err := asInt(values[1])
	if err != nil || holder == "" {
		return gate.RoomLease{}, err
	}
	return gate.RoomLease{Holder: holder, Until: time.UnixMicro(until)}, nil
}

func putBack(ctx context.Context, limiter any, key string, n int, r gate.Released, until time.Time) error {
	l, sp, err := meterFor(ctx, limiter, key)
	if err != nil {
		return err
	}
	if !r.OK || len(r.Back) != 3 {
		return nil
	}
	var untilUs int64
	if !until.IsZero() {
		untilUs = until.UnixMicro()
	}
	args := []any{"3", r.Waiter, r.Back[0], r.Back[1], r.Back[2]}
	args = append(args, sp.meterArgs(n)...)
	args = append(args, itoa(untilUs), itoa(roomLifetime.Microseconds()))
	err = l.cleanup(ctx, func(ctx context.Context) error {
		_, err := l.evalValues(ctx, roomScript, l.roomKeys(key), args)
		return err
	})
	if err != nil {
		return l.unavailable(ctx, err)
	}
	return nil
}

func resign(ctx context.Context, limiter any, key string, d gate.Dispatcher) error {
	l, err := meterOf(limiter)
	if err != nil {
		return err
	}
	state := l.Key(key)
	keys := append(l.roomKeys(key), state+startsSuffix, state+dispatcherSuffix)
	err = l.cleanup(ctx, func(ctx context.Context) error {
		_, err := l.evalValues(ctx, roomScript, keys, []any{"4", d.ID})
		return err
	})
	if err != nil {
		return l.unavailable(ctx, err)
	}
	return nil
}

func leaveRoom(ctx context.Context, limiter any, key, waiter string) error {
	l, err := meterOf(limiter)
	if err != nil {
		return err
	}
	err = l.cleanup(ctx, func(ctx context.Context) error {
		_, err := l.evalValues(ctx, roomScript, l.roomKeys(key), []any{"2", waiter, itoa(roomLifetime.Microseconds())})
		return err
	})
	if err != nil {
		return l.unavailable(ctx, err)
	}
	return nil
}

// evalValues runs a script under the timeout and returns its reply as it
// came, for scripts that answer with strings too.
func (c *conn) evalValues(ctx context.Context, script *redis.Script, keys []string, args []any) ([]any, error) {
	return c.evalReply(ctx, script, keys, args, false)
}

// evalReply is evalValues; with acked, and WithReplicaAcks set, it answers
// once replicas acknowledged the script's writes (see evalAcked).
func (c *conn) evalReply(ctx context.Context, script *redis.Script, keys []string, args []any, acked bool) ([]any, error) {
	c.noteUse()
	var values []any
	err := c.call(ctx, func(ctx context.Context) error {
		var err error
		if acked && c.cfg.acks > 0 {
			values, err = c.evalAckedValues(ctx, script, keys, args)
		} else {
			values, err = runCmd(ctx, c.client, script, keys, args).Slice()
		}
		return err
	})
	if err != nil {
		return nil, err // values may still be written by a detached call
	}
	return values, nil
}

// asInt reads an integer of a script's reply.
func asInt(v any) (int64, error) {
	n, ok := v.(int64)
	if !ok {
		return 0, fmt.Errorf("script returned %T, want an integer", v)
	}
	return n, nil
}

// nextRoom returns the soonest the meter r booked on may have room for one
// more unit, on the Redis clock, rounded up to the microsecond: the end of
// what is spoken for right after r, less the burst's other units. Zero
// when not known (nothing booked, a degraded reservation, a window).
func (r *Reservation) nextRoom() time.Time {
	if !r.OK || r.Degraded || r.sp == nil || !r.sp.reservable || r.sp.num == 0 || r.sp.den == 0 || r.undo[0] == 0 {
		return time.Time{}
	}
	// The end is undo[0] µs and undo[1] ticks; a unit is num ticks.
	rest := r.undo[1] - int64(r.sp.capacity-1)*r.sp.num
	return time.UnixMicro(r.undo[0] + ceilDivSigned(rest, r.sp.den))
}

// ceilDivSigned returns a/b rounded up, for b > 0 and a of either sign.
func ceilDivSigned(a, b int64) int64 {
	q := a / b
	if a%b > 0 {
		q++
	}
	return q
}
