package dashboard

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/jobthrottle/jobthrottle/internal/scan"
	"github.com/jobthrottle/jobthrottle/internal/waitroom"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// booking is one ticket's booking of a key's capacity ahead (Reserve by
// ticket, as the worker books a task's slot).
type booking struct {
	Ticket string `json:"ticket"`
	// UntilMs is the end of the capacity booked, on the Redis clock, in
	// Unix milliseconds; InMs is how far ahead of now that is.
	UntilMs int64 `json:"untilMs"`
	InMs    int64 `json:"inMs"`
}

// bookingsView is what a key has booked ahead.
type bookingsView struct {
	// Meter reports a TokenBucket or GCRA key, the policies that book.
	Meter bool `json:"meter"`
	// AheadMs is how long until the key's capacity is all free again:
	// what its bookings and recent admissions took.
	AheadMs int64     `json:"aheadMs"`
	Tickets []booking `json:"tickets"`
	// Waiting counts the worker's tasks in the key's waiting room.
	Waiting int64 `json:"waiting"`
	// Flows are the waiting room's flows (tenants, say), each with its
	// count, place and expected wait, by flow.
	Flows []waitroom.Flow `json:"flows"`
	// ExpectedWaitMs is how long until the room's last waiter is expected
	// to start.
	ExpectedWaitMs int64 `json:"expectedWaitMs"`
}

// maxTickets bounds the tickets a key's page lists.
const maxTickets = 200

// bookings reads key's bookings ahead: its tickets that still count (their
// generation is the key's current one) and whose slot is still to come,
// soonest first, and its waiting room.
func (h *Handler) bookings(ctx context.Context, v limiterView, caller string, now time.Time) (bookingsView, error) {
	b := bookingsView{Tickets: []booking{}, Flows: []waitroom.Flow{}}
	rd, err := h.inv.readerFor(v)
	if err != nil || rd == nil || rd.rate == nil {
		return b, err
	}
	if alg := v.Algorithm; (alg != "gcra" && alg != "tb") || v.Leased {
		return b, nil // a limiter with leased shares books nothing either
	}
	b.Meter = true
	state := rd.rate.Key(caller)
	r, err := rd.rate.Peek(ctx, caller)
	if err != nil {
		return b, err // not "capacity taken for the next 0s"
	}
	b.AheadMs = r.ResetAfter.Milliseconds()
	retryAfter := r.RetryAfter
	pipe := h.client.Pipeline()
	generation := pipe.Get(ctx, state+keyspace.TicketsSuffix)
	room := pipe.ZCard(ctx, state+keyspace.RoomSuffix)
	aside := pipe.ZCard(ctx, state+keyspace.AsideSuffix)
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return b, err
	}
	b.Waiting = room.Val() + aside.Val()
	if b.Waiting > 0 {
		// The room lets its waiters out at the policy in force for the key.
		inForce := v.Policy
		for _, o := range v.Overrides {
			if o.Key == caller {
				inForce = o.Policy
			}
		}
		policy, err := throttle.ParsePolicy(inForce)
		if err != nil {
			return b, err
		}
		r, err := waitroom.Read(ctx, h.client, state, policy, retryAfter, now)
		if err != nil {
			return b, err
		}
		b.Waiting, b.Flows, b.ExpectedWaitMs = int64(r.Waiting), r.Flows, r.ExpectedWait.Milliseconds()
	}
	if generation.Err() == redis.Nil {
		return b, nil // no ticket counts
	}
	tickets, err := scan.Match(ctx, h.client, scan.GlobEscape(state+keyspace.TicketInfix)+"*", state, h.cfg.timeout)
	if err != nil || len(tickets) == 0 {
		return b, err
	}
	pipe = h.client.Pipeline()
	values := make([]*redis.StringCmd, len(tickets))
	for i, t := range tickets {
		values[i] = pipe.Get(ctx, t)
	}
	// A ticket gone meanwhile reads as redis.Nil; any other failure is the
	// page's to show, not an empty list.
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return b, err
	}
	for i, t := range tickets {
		// "<end us>:<end ticks>:<grace ticks>:<generation>"
		fields := strings.Split(values[i].Val(), ":")
		if len(fields) != 4 || fields[3] != generation.Val() {
			continue
		}
		end, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			continue
		}
		id, _ := keyspace.Unescape(strings.TrimPrefix(t, state+keyspace.TicketInfix))
		until := time.UnixMicro(end)
		if !until.After(now) {
			// Its slot has passed (the task started, or will wait again):
			// its ticket lives on until its TTL, but books nothing ahead.
			continue
		}
		b.Tickets = append(b.Tickets, booking{Ticket: id, UntilMs: until.UnixMilli(), InMs: until.Sub(now).Milliseconds()})
	}
	slices.SortFunc(b.Tickets, func(x, y booking) int { return cmp.Compare(x.UntilMs, y.UntilMs) })
	b.Tickets = b.Tickets[:min(len(b.Tickets), maxTickets)]
	return b, nil
}
