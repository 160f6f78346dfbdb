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

// release is [gate.Release].
func release(ctx context.Context, limiter any, key string, n int, lead, notice time.Duration, holds []gate.Hold, d gate.Dispatcher, prep *gate.Prepared) (gate.Released, error) {
	l, sp, err := meterFor(ctx, limiter, key)
	if err != nil {
		return gate.Released{}, err
	}
	args := append([]any{"1"}, sp.meterArgs(n)...)
	args = append(args, itoa(sp.ticks(lead)), itoa(roomLifetime.Microseconds()), itoa(sp.ticks(notice)), d.ID, itoa(d.Lease.Microseconds()))
	state := l.Key(key)
	keys := append(l.roomKeys(key), state+startsSuffix, state+dispatcherSuffix)
	if prepKeys, prepArgs, ok := l.prepared(ctx, prep); ok {
		keys, args = append(keys, prepKeys...), append(args, prepArgs...)
	} else {
		args = append(args, "", "", "0", "0")
	}
	for _, h := range holds {
		args = append(args, h.Flow, itoa(h.Until.UnixMicro()))
	}
	values, err := l.evalValues(ctx, roomScript, keys, args)
	if err != nil {
		return gate.Released{}, l.unavailable(ctx, err)
	}
	ok, err := asInt(values[0])
	if err != nil {
		return gate.Released{}, l.unavailable(ctx, err)
	}
	if ok != 1 {
		due, err := asInt(values[1])
		if err != nil {
			return gate.Released{}, l.unavailable(ctx, err)
		}
		r := gate.Released{Elsewhere: ok == 2}
		if due > 0 {
			r.Due = time.UnixMicro(due)
		}
		return r, nil
	}
	if len(values) < 9 {
		return gate.Released{}, l.unavailable(ctx, fmt.Errorf("room.lua returned %d values for a release, want 9", len(values)))
	}
	waiter, _ := values[1].(string)
	payload, _ := values[2].(string)
	tag, _ := values[4].(string)
	flow, _ := values[7].(string)
	delay, err := asInt(values[3])
	if err != nil {
		return gate.Released{}, l.unavailable(ctx, err)
	}
	endUs, err1 := asInt(values[5])
	endTicks, err2 := asInt(values[6])
	if err1 != nil || err2 != nil {
		return gate.Released{}, l.unavailable(ctx, fmt.Errorf("room.lua's release end: %v, %v", err1, err2))
	}
	now, err := asInt(values[8])
	if err != nil {
		return gate.Released{}, l.unavailable(ctx, err)
	}
	var next time.Time
	if len(values) > 9 {
		if n, err := asInt(values[9]); err == nil {
			next = time.UnixMicro(n)
		}
	}
	units := int64(1)
	if len(values) > 10 {
		if units, err = asInt(values[10]); err != nil {
			return gate.Released{}, l.unavailable(ctx, err)
		}
	}
	r := gate.Released{OK: true, Waiter: waiter, Payload: payload, Flow: flow, N: int(units), Delay: micros(delay), Slot: time.UnixMicro(now + delay), Due: next,
		Back: []string{tag, itoa(endUs), itoa(endTicks)}, Moved: -1}
	if len(values) >= 15 {
		booked, _ := asInt(values[11])
		moved, _ := asInt(values[12])
		r.Booked, r.Moved = booked == 1, int(moved)
		r.Candidate, _ = values[13].(string)
		r.CandidatePayload, _ = values[14].(string)
	}
	return r, nil
}

// prepared returns the KEYS and ARGV of room.lua's release for the waiter
// prep names, when every meter it books decides on the room meter's
// client, one Redis server (its keys then need not share a slot); ok is
// false otherwise.
func (l *Limiter) prepared(ctx context.Context, prep *gate.Prepared) (keys []string, args []any, ok bool) {
	if prep == nil || prep.Waiter == "" || len(prep.TaskKeys) != 4 {
		return nil, nil, false
	}
	if _, single := l.client.(*redis.Client); !single {
		return nil, nil, false
	}
	keys = append(keys, prep.TaskKeys...)
	args = []any{prep.Waiter, prep.TaskID, itoa(time.Now().UnixNano()), strconv.Itoa(len(prep.Along))}
	for _, part := range prep.Along {
		m, sp, err := meterFor(ctx, part.Limiter, part.Key)
		if err != nil || m.client != l.client || validRequest(part.Key, part.N, sp.capacity) != nil {
			return nil, nil, false
		}
		state := m.Key(part.Key)
		keys = append(keys, state, ticketKey(state, prep.Waiter), state+keyspace.TicketsSuffix, state+startsSuffix)
		args = append(append(args, sp.meterArgs(part.N)...), itoa(sp.ticks(prep.Grace)))
	}
	return keys, args, true
}
