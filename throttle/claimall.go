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

// claimAll is [gate.ClaimAll]: one meter_claim.lua call for every meter
// when they decide on one client, of one Redis server or of a Cluster
// where every meter's key has the same hash tag (the same caller key, or a
// prefix holding a hash tag: all are in one slot), else a call per meter.
func claimAll(ctx context.Context, parts []gate.ClaimPart, entry *gate.Entry) (gate.Claimed, error) {
	if len(parts) == 0 {
		return gate.Claimed{}, nil
	}
	if parts[0].Req.Held != gate.HeldByRoom {
		entry = nil
	}
	meters := make([]*Limiter, len(parts))
	specs := make([]*spec, len(parts))
	together := true
	states := make([]string, len(parts))
	for i, p := range parts {
		l, sp, err := meterFor(ctx, p.Limiter, p.Req.Key)
		if err == nil {
			err = validRequest(p.Req.Key, p.Req.N, sp.capacity)
		}
		if err != nil {
			return gate.Claimed{}, err
		}
		meters[i], specs[i], states[i] = l, sp, l.Key(p.Req.Key)
		together = together && l.client == meters[0].client
	}
	if _, single := meters[0].client.(*redis.Client); !together || !(single || keyspace.OneSlot(states...)) || (len(parts) == 1 && entry == nil) {
		return claimInTurn(ctx, parts, meters, specs, entry)
	}
	began := meters[0].began()
	var keys []string
	args := []any{"2"}
	for i, p := range parts {
		keys = append(keys, meters[i].claimKeys(p.Req)...)
		args = append(args, claimArgs(specs[i], p.Req)...)
	}
	if entry != nil {
		keys = append(keys, states[0]+flowsSuffix, states[0]+heldSuffix, states[0]+dispatcherSuffix)
		args = append(args, entry.Flow, strconv.Itoa(entry.Weight), itoa(max(0, entry.Late.Microseconds())), entry.Payload)
	}
	values, err := meters[0].evalValues(ctx, meterClaimScript, keys, args)
	var out gate.Claimed
	for i := 0; err == nil && 6*i+6 <= len(values) && i < len(parts); i++ {
		var c gate.Claim
		if c, err = claimOf(values[6*i:]); err == nil {
			out.Claims = append(out.Claims, c)
		}
	}
	if rest := len(values) - 6*len(out.Claims); err == nil && rest == 5 {
		var size int64
		size, err = asInt(values[len(values)-5])
		out.Entered, out.Waiters = true, int(size)
		if err == nil {
			out.Lease, err = roomLeaseOf(values[len(values)-2:])
		}
	}
	if err == nil && len(out.Claims) == 0 {
		err = fmt.Errorf("meter_claim.lua returned %d values for %d meters", len(values), len(parts))
	}
	if err != nil {
		return gate.Claimed{}, meters[0].unavailable(ctx, err)
	}
	observeClaims(ctx, parts, meters, specs, out.Claims, began)
	return out, nil
}

// observeClaims reports a task's claims under several meters to their
// limiters' observers once the outcome is known: when every meter admitted
// the task, each claim (a start by a booking made at its release
// included: the booking was not reported); when one refused, only that
// one, as throttled, the claims before it having been given back.
func observeClaims(ctx context.Context, parts []gate.ClaimPart, meters []*Limiter, specs []*spec, claims []gate.Claim, began time.Time) {
	if len(claims) == 0 {
		return
	}
	last := claims[len(claims)-1]
	all := len(claims) == len(parts) && (last.Status == gate.Taken || last.Status == gate.Admitted)
	for i, c := range claims {
		if all || i == len(claims)-1 {
			meters[i].observeGate(ctx, parts[i].Req.Key, parts[i].Req.N, began, specs[i], c.Status == gate.Taken || c.Status == gate.Admitted, c.Slot, nil)
		}
	}
}

// claimInTurn claims under each meter in turn, and enters the room, as
// claimAll does in one call.
func claimInTurn(ctx context.Context, parts []gate.ClaimPart, meters []*Limiter, specs []*spec, entry *gate.Entry) (gate.Claimed, error) {
	var out gate.Claimed
	began := meters[0].began()
	defer func() { observeClaims(ctx, parts, meters, specs, out.Claims, began) }()
	giveBack := func() {
		for i := len(out.Claims) - 1; i >= 0; i-- {
			p := parts[i]
			_ = undoClaim(ctx, p.Limiter, p.Req.Key, p.Req.N, p.Req.Held, p.Req.Ticket, out.Claims[i])
		}
	}
	for i, p := range parts {
		req := p.Req
		if i > 0 {
			req.At = out.Claims[0].Slot
		}
		c, err := meters[i].claim(ctx, specs[i], req)
		if err != nil {
			giveBack()
			out.Claims = nil
			meters[i].observeGate(ctx, req.Key, req.N, began, specs[i], false, time.Time{}, err)
			return gate.Claimed{}, err
		}
		if c.Status == gate.Taken || c.Status == gate.Admitted {
			out.Claims = append(out.Claims, c)
			continue
		}
		giveBack()
		out.Claims = append(out.Claims, c)
		if entry == nil || (i > 0 && out.Claims[0].Status == gate.Admitted) {
			return out, nil
		}
		var after time.Duration
		switch {
		case i == 0 && c.Status == gate.Late:
			after = entry.Late
		case i > 0:
			after = max(0, c.Wait)
		}
		first := parts[0].Req
		size, lease, err := enterRoom(ctx, parts[0].Limiter, first.Key, first.Ticket, entry.Flow, entry.Weight, first.N, after, entry.Payload)
		if err != nil {
			return gate.Claimed{}, err
		}
		out.Entered, out.Waiters, out.Lease = true, size, lease
		return out, nil
	}
	return out, nil
}

// claimKeys returns the six keys of one meter of a claim under several
// (meter_claim.lua's mode 2): those its request uses, then keys of its
// own it leaves alone.
func (l *Limiter) claimKeys(req gate.ClaimRequest) []string {
	keys := l.startKeys(req.Key, req.Held, req.Ticket)
	state := l.Key(req.Key)
	for _, pad := range []string{state + waitersSuffix, state + roomSuffix, state + asideSuffix} {
		if len(keys) == 6 {
			break
		}
		keys = append(keys, pad)
	}
	return keys
}
