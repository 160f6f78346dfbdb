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
func release(ctx context.Context, limiter any, key string, n int, lead, notice time.Duration, holds []gate.Hold, d gate.Dispatcher, b gate.Batch) (gate.Released, error) {
	l, sp, err := meterFor(ctx, limiter, key)
	if err != nil {
		return gate.Released{}, err
	}
	args := append([]any{"1"}, sp.meterArgs(n)...)
	args = append(args, itoa(sp.ticks(lead)), itoa(roomLifetime.Microseconds()), itoa(sp.ticks(notice)), d.ID, itoa(d.Lease.Microseconds()))
	state := l.Key(key)
	keys := append(l.roomKeys(key), state+startsSuffix, state+dispatcherSuffix)
	var prepKeys []string
	var prepArgs []any
	prepared := 0
	for _, prep := range b.Prepared {
		if k, a, ok := l.prepared(ctx, prep, state); ok {
			prepKeys, prepArgs, prepared = append(prepKeys, k...), append(prepArgs, a...), prepared+1
		}
	}
	args = append(args, strconv.Itoa(prepared), itoa(time.Now().UnixNano()), itoa(sp.ticks(max(0, b.Window))), strconv.Itoa(max(1, b.Most)))
	keys, args = append(keys, prepKeys...), append(args, prepArgs...)
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
	first, err := releasedOf(values)
	if err != nil {
		return gate.Released{}, l.unavailable(ctx, err)
	}
	for i := releasedLen; i < len(values); {
		if mark, _ := values[i].(string); mark == "#" {
			for j := i + 1; j+1 < len(values); j += 2 {
				id, _ := values[j].(string)
				payload, _ := values[j+1].(string)
				first.Next = append(first.Next, gate.Waiting{ID: id, Payload: payload})
			}
			break
		}
		r, err := releasedOf(values[i:])
		if err != nil {
			return gate.Released{}, l.unavailable(ctx, err)
		}
		first.More = append(first.More, r)
		i += releasedLen
	}
	return first, nil
}

// releasedLen is how many values room.lua returns for each waiter let out.
const releasedLen = 13

// releasedOf reads the record room.lua returns for a waiter let out.
func releasedOf(values []any) (gate.Released, error) {
	if len(values) < releasedLen {
		return gate.Released{}, fmt.Errorf("room.lua returned %d values for a release, want %d", len(values), releasedLen)
	}
	var ints [releasedLen]int64
	for _, i := range []int{3, 5, 6, 8, 9, 10, 11, 12} {
		v, err := asInt(values[i])
		if err != nil {
			return gate.Released{}, fmt.Errorf("room.lua's release, value %d: %w", i+1, err)
		}
		ints[i] = v
	}
	r := gate.Released{OK: true, N: int(ints[10]), Delay: micros(ints[3]), Slot: time.UnixMicro(ints[8] + ints[3]), Due: time.UnixMicro(ints[9]),
		Booked: ints[11] == 1, Moved: int(ints[12])}
	r.Waiter, _ = values[1].(string)
	r.Payload, _ = values[2].(string)
	tag, _ := values[4].(string)
	r.Flow, _ = values[7].(string)
	r.Back = []string{tag, itoa(ints[5]), itoa(ints[6])}
	return r, nil
}

// prepared returns the KEYS and ARGV of room.lua's release for the waiter
// prep names, when every meter it books decides on the room meter's
// client, and that is one Redis server or all the keys (the task's in
// asynq's queue, the room's state key room, and the meters') share a hash
// tag, so a slot; ok is false otherwise.
func (l *Limiter) prepared(ctx context.Context, prep *gate.Prepared, room string) (keys []string, args []any, ok bool) {
	if prep == nil || prep.Waiter == "" || len(prep.TaskKeys) != 4 {
		return nil, nil, false
	}
	_, single := l.client.(*redis.Client)
	keys = append(keys, prep.TaskKeys...)
	args = []any{prep.Waiter, prep.TaskID, strconv.Itoa(len(prep.Along))}
	for _, part := range prep.Along {
		m, sp, err := meterFor(ctx, part.Limiter, part.Key)
		if err != nil || m.client != l.client || validRequest(part.Key, part.N, sp.capacity) != nil {
			return nil, nil, false
		}
		state := m.Key(part.Key)
		keys = append(keys, state, ticketKey(state, prep.Waiter), state+keyspace.TicketsSuffix, state+startsSuffix)
		args = append(append(args, sp.meterArgs(part.N)...), itoa(sp.ticks(prep.Grace)))
	}
	if !single && !keyspace.OneSlot(append(keys, room)...) {
		return nil, nil, false
	}
	return keys, args, true
}
