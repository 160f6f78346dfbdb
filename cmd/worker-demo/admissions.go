package main

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The limits are decided on the Redis server's clock: a call is admitted
// at a slot there, and reaches the partner a little later on this
// process's clock, by the time a timer, the Go scheduler, asynq's
// goroutines and a loopback socket take. For rate rules the summary checks
// the limits strictly on the admissions, and how late after its admission
// each call reached the partner (see checkRates).

// arrivalWithin is how much later than its admission a call may reach the
// partner. Measured with the demo test (TestDemoHoldsThePolicy logs the
// figures) in the whole suite, `go test ./...`, while two other processes
// kept both cores of a 2-core machine busy: the latest call came 30, 38,
// 30, 55 and 187 ms after its admission (five runs), 33-48 ms under the
// race detector (three runs), 3-11 ms in CI's runs on an idle machine.
// arrivalWithin is about twice the most.
const arrivalWithin = 400 * time.Millisecond

// clockOffset estimates how far the Redis server's clock is ahead of this
// process's, and within how much: half the round trip of the TIME that
// read it, plus a millisecond for TIME's rounding.
func clockOffset(ctx context.Context, rdb redis.UniversalClient) (offset, within time.Duration, err error) {
	best := time.Duration(-1)
	for range 5 {
		sent := time.Now()
		server, err := rdb.Time(ctx).Result()
		if err != nil {
			return 0, 0, err
		}
		rtt := time.Since(sent)
		if best < 0 || rtt < best {
			best = rtt
			offset = server.Sub(sent.Add(rtt / 2))
		}
	}
	return offset, best/2 + time.Millisecond, nil
}

// admitLocked records the admission of a partner call on the Redis clock,
// for tenant, keeping the lists in order. d.mu is held.
func (d *demo) admitLocked(tenant string, slot time.Time) {
	d.admitted[tenant] = insertInOrder(d.admitted[tenant], slot)
	d.allAdmitted = insertInOrder(d.allAdmitted, slot)
}

// insertInOrder inserts t into the ordered ts.
func insertInOrder(ts []time.Time, t time.Time) []time.Time {
	i, _ := slices.BinarySearchFunc(ts, t, time.Time.Compare)
	return slices.Insert(ts, i, t)
}

// admissionsLocked returns the admissions of a tenant's partner calls ("" for
// all), in order, on the Redis clock. The caller must not change them.
// d.mu is held.
func (d *demo) admissionsLocked(tenant string) []time.Time {
	if tenant == "" {
		return d.allAdmitted
	}
	return d.admitted[tenant]
}

// originalID returns the ID of the task a copy was made from (the
// Throttler names a copy by its original's ID and "~1", "~2"...).
func originalID(id string) string {
	if i := strings.IndexByte(id, '~'); i >= 0 {
		return id[:i]
	}
	return id
}

// lateness pairs calls that reached the partner with their admissions, in
// order (calls leave in the order of their slots), and returns how much
// later than its admission, brought to this process's clock, the earliest
// and the latest call arrived. An admission whose call never arrived (it
// failed on the way and ran again) shifts the pairing: the calls after it
// show as later than they were. ok is false when more calls arrived than
// were admitted.
func lateness(arrivals, admitted []time.Time, offset time.Duration) (least, most time.Duration, ok bool) {
	if len(arrivals) > len(admitted) {
		return 0, 0, false
	}
	for i, at := range arrivals {
		late := at.Sub(admitted[i].Add(-offset))
		if i == 0 || late < least {
			least = late
		}
		if i == 0 || late > most {
			most = late
		}
	}
	return least, most, true
}
