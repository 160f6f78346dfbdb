// Package gate is what package worker needs of package throttle's meters
// beyond their public API: the strict start of a task (a second instant per
// key that records when tasks actually start), and the key's waiting room,
// from which tasks are released one by one in fair order. Package throttle
// implements the functions below when it is initialised; they are only for
// the library's own packages.
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

// StartRequest asks a meter limiter to start a task on a key.
type StartRequest struct {
	Key       string
	N         int
	Held      int    // HeldNowhere, HeldByTicket or HeldByRoom
	Ticket    string // the ticket (HeldByTicket) or the waiter's ID (HeldByRoom)
	NotBefore time.Duration
	MaxWait   time.Duration
}

// Start statuses.
const (
	NoCapacity = 0 // the task holds none, and the meter (or its room) has none now
	Admitted   = 1 // start after Wait
	TooLate    = 2 // the task holds capacity, but its start comes after MaxWait
)

// Start is a meter's answer to a StartRequest.
type Start struct {
	Status int
	// Wait is how long until the start (Admitted), until the meter has
	// room (NoCapacity; 0 when the room decides), or until the start could
	// be (TooLate).
	Wait time.Duration
	// At is the start on the Redis clock (Admitted).
	At time.Time
	// Undo is what UndoStart needs; opaque.
	Undo []string
}

// Released is a waiter let out of a room.
type Released struct {
	OK      bool
	Waiter  string
	Payload string
	// Delay is how long after the release its reserved start comes.
	Delay time.Duration
	// Due is when to try the room again when none was released (zero:
	// the room is empty).
	Due time.Time
}

// The meters' side, set by package throttle. limiter is a
// *throttle.Limiter of TokenBucket or GCRA.
var (
	// Meter reports whether limiter is a meter the functions below serve.
	Meter func(limiter any) bool
	// StartOn starts a task under limiter.
	StartOn func(ctx context.Context, limiter any, req StartRequest) (Start, error)
	// UndoStart gives back an admitted start whose task will not run now.
	UndoStart func(ctx context.Context, limiter any, key string, n int, held int, waiter string, s Start) error
	// EnterRoom puts a waiter in key's room; eligible is the soonest it may
	// start. It returns the waiters in the room.
	EnterRoom func(ctx context.Context, limiter any, key, waiter, flow string, weight int, eligible time.Time, payload string) (int, error)
	// Release lets the next waiter of key's room out, when the meter
	// admits its start within lead.
	Release func(ctx context.Context, limiter any, key string, n int, lead time.Duration) (Released, error)
	// LeaveRoom removes a waiter, or a release nobody came for.
	LeaveRoom func(ctx context.Context, limiter any, key, waiter string) error
)
