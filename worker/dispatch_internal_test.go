package worker

import (
	"container/heap"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/gate"
)

// TestARoomHeldElsewhereIsNotAsked: a room's turn queued before its
// process heard that another dispatcher holds the room's lease waits for
// that lease's end (a release by this process would let nobody out);
// hearing that nobody holds it, or this process does, brings the turn back.
func TestARoomHeldElsewhereIsNotAsked(t *testing.T) {
	for _, tc := range []struct {
		name    string
		holder  string
		putOff  bool
		settled string // what a later entry heard
	}{
		{name: "held by another", holder: "other", putOff: true},
		{name: "held by this process", holder: "self"},
		{name: "held by nobody", holder: ""},
		{name: "held by another, then by nobody", holder: "other", settled: "nobody"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			th := &Throttler{}
			d := &th.dispatch
			d.self = gate.Dispatcher{ID: "self", Lease: dispatcherLease}
			rule := &Rule{name: "overall"}
			room := roomID{rule, "all"}
			now := time.Now()
			d.rooms = map[roomID]time.Time{room: now}
			heap.Push(&d.turns, turn{at: now, rule: rule, key: "all"})
			leaseEnd := now.Add(3 * time.Second)
			th.heardOfLease(rule, "all", gate.RoomLease{Holder: tc.holder, Until: leaseEnd})
			if tc.settled == "nobody" {
				th.heardOfLease(rule, "all", gate.RoomLease{})
			}
			got := th.due(now)
			if !tc.putOff {
				if len(got) != 1 || got[0].rule != rule {
					t.Fatalf("due: %+v; want the room's turn now", got)
				}
				return
			}
			if len(got) != 0 {
				t.Fatalf("due now: %+v; want none while another holds the lease", got)
			}
			if len(d.turns) != 1 || d.turns[0].at.Before(leaseEnd) || d.turns[0].at.After(leaseEnd.Add(100*time.Millisecond)) {
				t.Fatalf("turns: %+v; want the room's turn just after the lease's end, %s", d.turns, leaseEnd)
			}
			if got := th.due(d.turns[0].at); len(got) != 1 {
				t.Fatalf("due at the lease's end: %+v; want the room's turn", got)
			}
		})
	}
}
