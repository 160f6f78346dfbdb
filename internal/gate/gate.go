// Package gate is what package worker needs of package throttle's meters
// beyond their public API: the strict start of a task (a second instant per
// key that records when tasks actually start), the key's waiting room, from
// which tasks are released one by one in fair order, and the start of a task
// released from a room, at its slot. Package throttle implements the
// functions below when it is initialised; they are only for the library's
// own packages.
package gate

import (
	"context"
	"time"
)

// Where a task's capacity of the planned meter is held.
const (
	HeldNowhere  = iota // a fresh task: the meter must have room now
	HeldByTicket        // booked ahead with Reserve, by ticket
	HeldByRoom          // released from the key's waiting room
)

// StartRequest asks a meter limiter to start a task on a key that does not
// wait in a room.
type StartRequest struct {
	Key       string
	N         int
	Held      int    // HeldNowhere or HeldByTicket
	Ticket    string // the ticket (HeldByTicket)
	NotBefore time.Duration
	MaxWait   time.Duration
	// BookAhead, with a ticket: when the task holds nothing and the meter
	// has no room now, book the task's slot by its ticket up to this far
	// ahead (0: book nothing), claimable for Grace after it starts.
	// Otherwise: how long the planned meter may keep a task that holds
	// nothing waiting (up to MaxWait); 0 takes only room there is now.
	BookAhead, Grace time.Duration
	// Lane, with a ticket on one Redis server: a task told to come back
	// (TooLate, Booked) joins this return lane in the same call.
	Lane *LaneJoin
}

// LaneJoin puts a task told to come back in its queue's return lane in
// Redis (see the worker's lane_poll.lua).
type LaneJoin struct {
	Lane, Holder string // the lane's keys
	Task         string // the task's asynq ID
	// Lead is how long before its start the task is to be moved.
	Lead time.Duration
	// Dispatcher names the caller's dispatcher, the lane's holder for
	// Lease when nobody holds it; the lane is kept at least Keep past the
	// task's move.
	Dispatcher  string
	Lease, Keep time.Duration
}

// LaneHolder is who held a lane the task joined, and till when.
type LaneHolder struct {
	Joined bool
	Holder string
	Until  time.Time
}

// Start statuses.
const (
	NoCapacity = 0 // the task holds none, and the meter has none in time
	Admitted   = 1 // start after Wait
	TooLate    = 2 // the task holds capacity, but its start comes after MaxWait
	Booked     = 3 // its slot is booked by its ticket, Wait away, after MaxWait
	NotBooked  = 4 // a slot would come Wait past BookAhead: nothing booked
)

// Start is a meter's answer to a StartRequest.
type Start struct {
	Status int
	// Wait is how long until the start (Admitted), until the meter has
	// room (NoCapacity), or until the start could be (TooLate).
	Wait time.Duration
	// At is the start on the Redis clock (Admitted).
	At time.Time
	// Undo is what UndoStart needs; opaque.
	Undo []string
	// Lane: the return lane the task joined (TooLate, Booked with a
	// StartRequest.Lane).
	Lane LaneHolder
}

// ClaimRequest asks a meter limiter to start a task that waits in a room
// (see ClaimAll): at its held slot, or at room there is (meter_claim.lua).
type ClaimRequest struct {
	Key    string
	N      int
	Held   int    // HeldNowhere, HeldByTicket or HeldByRoom
	Ticket string // the ticket (HeldByTicket) or the waiter's ID (HeldByRoom)
	// At, when set, is the start's instant on the Redis clock (it may have
	// just passed): the start is there or not at all. Otherwise a task that
	// holds nothing takes the meter's next start within MaxWait.
	At      time.Time
	MaxWait time.Duration
	// Grace is how late after its slot a held start may still be claimed.
	Grace time.Duration
}

// ClaimPart is one meter of a ClaimAll: a *throttle.Limiter and its
// request.
type ClaimPart struct {
	Limiter any
	Req     ClaimRequest
}

// Entry is what a waiter enters a room with (see EnterRoom); its ID and
// units are its claim's.
type Entry struct {
	Flow    string
	Weight  int
	Late    time.Duration // a waiter late for its slot: let out no sooner than this from now
	Payload string
}

// Claimed is what ClaimAll did: the claims made, and whether the task
// entered the room (Entered, with the waiters there then).
type Claimed struct {
	Claims  []Claim
	Entered bool
	Waiters int
	Lease   RoomLease // the room's dispatcher lease, when Entered
}

// RoomLease is who held a room's dispatcher lease when a waiter entered
// it, and till when on the Redis clock: Holder "" when nobody did.
type RoomLease struct {
	Holder string
	Until  time.Time
}

// Claim statuses, beside NoCapacity and Admitted (by capacity held).
const (
	Taken = 5 // admitted, the capacity taken now
	Late  = 6 // the task's held slot passed more than Grace ago: lost
)

// Claim is a meter's answer to a ClaimRequest.
type Claim struct {
	Status int
	// Slot is the start on the Redis clock (Admitted, Taken, Late), or when
	// the meter would have room (NoCapacity; zero when the room decides).
	Slot time.Time
	// Wait is how long after the answer Slot comes (negative: it passed).
	Wait time.Duration
	// Undo is what UndoClaim needs; opaque.
	Undo []string
}

// Released is a waiter let out of a room.
type Released struct {
	OK      bool
	Waiter  string
	Payload string
	Flow    string
	// N is the units the waiter's start takes, reserved by the release.
	N int
	// Delay is how long after the release its reserved start comes.
	Delay time.Duration
	// Slot is that start on the Redis clock.
	Slot time.Time
	// Due is when to try the room again: when the next waiter may be let
	// out (OK), or when one may be (zero: the room is empty), or when the
	// lease of the dispatcher that holds it ends (Elsewhere).
	Due time.Time
	// Elsewhere: another dispatcher holds the room's lease; nothing was
	// released.
	Elsewhere bool
	// Booked: the waiter was the one prepared for, and its slot is booked
	// on its other meters; Moved is then what moving its task to the head
	// of its queue did (1 moved, 2 not there yet, 0 gone), else -1.
	Booked bool
	Moved  int
	// More are the waiters let out after this one in the same call (see
	// Batch), and Next the first waiting in the room's order after the
	// call (Batch.Most of them, one for the zero Batch): those to prepare
	// the next release for.
	More []Released
	Next []Waiting
	// Back is what PutBack needs; opaque.
	Back []string
}

// Dispatcher names the one dispatcher of the fleet that lets a room's
// waiters out: a release by ID takes the room's lease for Lease, or renews
// it, unless another ID holds it. An empty ID asks for no lease.
type Dispatcher struct {
	ID    string
	Lease time.Duration
}

// Prepared is the waiter a dispatcher expects a room to let out next, and
// what its release then does in the same call: book its slot, by its ID
// and claimable for Grace after it, on each of its other meters (Along),
// and move its task (TaskID; TaskKeys: asynq's retry, scheduled and
// pending keys of its queue and the task's hash) to the head of its
// queue. Only on one Redis server whose meters share the room's client;
// elsewhere it is left out.
type Prepared struct {
	Waiter   string
	TaskID   string
	TaskKeys []string
	Along    []AlongPart
	Grace    time.Duration
}

// Batch is how many waiters a release may let out in one call: the first
// as its lead says, then more, up to Most, while the next start is within
// the lead and Window after it; Prepared are the waiters it expects (see
// Prepared). The zero Batch lets one waiter out and prepares for none.
type Batch struct {
	Prepared []*Prepared
	Window   time.Duration
	Most     int
}

// CapParking is what a waiter refused by a cap needs to be parked in line:
// its payload, handed to the limiter's OnCapCall function when a release
// calls it back, and how long its place in line is kept.
type CapParking struct {
	Payload string
	TTL     time.Duration
}

// Waiting is a waiter in a room: its ID and payload.
type Waiting struct {
	ID, Payload string
}

// AlongPart is one of a waiter's other meters: a *throttle.Limiter, its
// key and the units its start takes.
type AlongPart struct {
	Limiter any
	Key     string
	N       int
}

// Hold holds a flow of a room back until an instant of the Redis clock:
// another limit of the flow's own has no room before then.
type Hold struct {
	Flow  string
	Until time.Time
}

// Booking is what BookAt or ReserveFor booked.
type Booking struct {
	OK      bool
	Slot    time.Time // its start on the Redis clock (OK)
	StartAt time.Time // its start on this process's clock (ReserveFor, OK)
	// Next is the soonest the meter may have room for one more unit after
	// this booking, on the Redis clock (BookAt, OK): later bookings or
	// starts only move it later.
	Next       time.Time
	RetryAfter time.Duration
	// Cancel gives it back (see throttle's Reservation.Cancel).
	Cancel func(ctx context.Context) error
}

// Ticket names a caller that books now and comes to claim its booking
// later, such as a queued task: ID identifies it (a task ID). Grace is how
// long after its slot has started a new booking may still be claimed, for
// a caller whose arrival is not exact (asynq delivers tasks in whole
// seconds); it is kept with the booking. NotBefore makes a new booking
// start no sooner than that long from now, for a caller that cannot arrive
// sooner (a task that must travel through a queue first).
type Ticket struct {
	ID        string
	Grace     time.Duration
	NotBefore time.Duration
}

// The meters' side, set by package throttle. limiter is a
// *throttle.Limiter of TokenBucket or GCRA.
var (
	// Meter reports whether limiter is a meter the functions below serve.
	Meter func(limiter any) bool

	// Leased reports whether limiter decides from leased shares
	// (throttle.WithLeasedShares): the worker asks it with AllowN, mostly
	// in memory, and gives back with GiveBackLeased.
	Leased func(limiter any) bool
	// GiveBackLeased returns n units of key that limiter admitted in this
	// process's share (a Result with Leased set) and whose task will not
	// run now.
	GiveBackLeased func(limiter any, key string, n int)
	// Changeable reports whether limiter's policy may change while tasks
	// wait for it (a named limiter reads stored policies): its tasks then
	// wait in its room, released at the policy in force, rather than
	// booking slots at today's.
	Changeable func(limiter any) bool
	// StartOn starts a task under limiter.
	StartOn func(ctx context.Context, limiter any, req StartRequest) (Start, error)
	// UndoStart gives back an admitted start whose task will not run now.
	UndoStart func(ctx context.Context, limiter any, key string, n int, held int, waiter string, s Start) error
	// ClaimAll claims a task's start under several meters at one instant:
	// the first as its request says, each other at the first's slot (its
	// request's At is not read). It stops at the first meter that does not
	// admit the task, after giving back what the meters before it took,
	// and returns the claims made, that one included. With an entry, and
	// the first meter's start by room, a task refused (but a released
	// waiter refused by another meter) enters the first meter's room: to
	// be let out no sooner than the refusing meter has room, or entry.Late
	// from now when its slot had passed. When every meter decides on one
	// client, of one Redis server or of a Cluster where every part is for
	// the same key (one slot), it is one round trip.
	ClaimAll func(ctx context.Context, parts []ClaimPart, entry *Entry) (Claimed, error)
	// UndoClaim gives back a claim whose task will not run now.
	UndoClaim func(ctx context.Context, limiter any, key string, n int, held int, waiter string, c Claim) error
	// EnterRoom puts a waiter in key's room, to start no sooner than after
	// from now (on the Redis clock), its start taking n units of the
	// meter. weight 0 queues it first come, first served; 1 and more share
	// the room fairly between flows, by weight (and units). It returns the
	// waiters in the room, those of flows held back (set aside) included,
	// and who held its dispatcher lease.
	EnterRoom func(ctx context.Context, limiter any, key, waiter, flow string, weight, n int, after time.Duration, payload string) (int, RoomLease, error)
	// Release lets the next waiter of key's room out, when the meter
	// admits its start within lead, its start no sooner than notice (at
	// most lead) after the release. It first holds back the flows of holds
	// (a hold shorter than the flow's standing one changes nothing). While
	// another dispatcher holds the room's lease it releases nothing.
	// b lets out several waiters in one call, and books and moves those
	// it was prepared for.
	Release func(ctx context.Context, limiter any, key string, n int, lead, notice time.Duration, holds []Hold, d Dispatcher, b Batch) (Released, error)
	// PutBack returns a released waiter to key's room, its place kept and
	// its capacity given back, and holds its flow back until until (when
	// another limit of the flow has no room before).
	PutBack func(ctx context.Context, limiter any, key string, n int, r Released, until time.Time) error
	// BookAt books n units of key by ticket (claimable for grace after its
	// slot) at the instant at of the Redis clock, or up to slack after it;
	// with no room by then it books nothing and says how much longer the
	// wait would be. A standing booking of the ticket is returned as it is.
	BookAt func(ctx context.Context, limiter any, key, ticket string, n int, at time.Time, slack, grace time.Duration) (Booking, error)
	// ReserveFor is a *throttle.Limiter's Reserve on behalf of a caller
	// that will ask again with the same ticket: until the booking's grace
	// after its slot's start, asking again returns that booking rather than
	// booking anew. Only TokenBucket and GCRA keep tickets (see Meter).
	ReserveFor func(ctx context.Context, limiter any, key string, t Ticket, n int, maxDelay time.Duration) (Booking, error)
	// Resign ends d's lease of key's room, if d holds it, so that another
	// dispatcher takes the room over at once.
	Resign func(ctx context.Context, limiter any, key string, d Dispatcher) error
	// LeaveRoom removes a waiter, or a release nobody came for.
	LeaveRoom func(ctx context.Context, limiter any, key, waiter string) error
	// CapWait stands waiter in the line of a *throttle.ConcurrencyLimiter's
	// key until it gets a slot (its *throttle.Lease), ctx ends (an error)
	// or budget runs out (nil, nil: the waiter stays in line). A waiter
	// called back from parking waits without a budget. ahead is how many
	// waited before it at the last look. With park, the waiter is parked
	// by the line itself, with no call of its own: at once, in the call
	// that refused it, when it is so far back in line that it could not
	// get a slot within budget (as the limiter's recent holds go), and
	// otherwise when its budget runs out; parked is then true. Without
	// park, a waiter whose budget ran out leaves the line with CapLeave.
	CapWait func(ctx context.Context, limiter any, key, waiter string, budget time.Duration, park *CapParking) (lease any, ahead int, parked bool, err error)
	// CapLeave takes a waiter out of the line.
	CapLeave func(ctx context.Context, limiter any, key, waiter string) error
	// OnCapCall sets what brings back the parked waiters the limiter's
	// releases call: call, given the payloads of the waiters one release
	// called (together, so that their tasks are moved in one call); and task,
	// which returns the asynq ID and keys (see Prepared.TaskKeys) of a
	// parked waiter's task from its payload, so that a release that calls
	// it moves the task to the head of its queue in the same call (ok
	// false: call does it).
	OnCapCall func(limiter any, call func(payloads []string), task func(payload string) (id string, keys []string, ok bool))
	// ClientOf returns the client a *throttle.Limiter or
	// *throttle.ConcurrencyLimiter decides through, or nil.
	ClientOf func(limiter any) any
	// Together returns a context with which the first script call of each
	// of n goroutines, made through client, waits until each of them has
	// made one or called done, and all go to Redis in one pipelined round
	// trip (on a Cluster, one per node). Each goroutine calls done when it
	// ends, call made or not. Later calls go on their own.
	Together func(ctx context.Context, client any, n int) (context.Context, func())
	// UsedByRule records in the limiter's entry of the registry of names
	// that the worker's rule uses it (a *throttle.Limiter or
	// *throttle.ConcurrencyLimiter; others are passed over).
	UsedByRule func(limiter any, rule string)
)
