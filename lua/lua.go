// Package lua holds jobthrottle's Redis scripts as readable .lua files,
// embedded into the binary with go:embed.
//
// Each algorithm's file opens with a header naming its KEYS, ARGV and
// return value. [Common] holds helpers shared by all of them; package
// throttle runs each script as the helpers it uses followed by the
// algorithm's own file (see [Source]), so the text Redis receives is
// self-contained.
//
// Every script reads the clock with redis.call('TIME'), declares every key
// it touches in KEYS (all in one Cluster slot), and gives every key it
// writes an expiry (the return lane's, lane.lua, moves asynq's own keys and
// leaves their expiry to asynq); scripts return integers, and strings where
// their header says so. Package lua has no code beyond the embedding and is
// safe for concurrent use.
package lua

import (
	_ "embed"
	"regexp"
	"strings"
)

// Common holds the helpers every script starts with: the server clock,
// exact integer division, and state encoding.
//
//go:embed common.lua
var Common string

// FixedWindow is the fixed-window counter script.
//
//go:embed fixed_window.lua
var FixedWindow string

// SlidingLog is the exact sliding-window log script (one sorted-set entry
// per admitted unit).
//
//go:embed sliding_log.lua
var SlidingLog string

// SlidingWindow is the two-counter sliding-window approximation script.
//
//go:embed sliding_window.lua
var SlidingWindow string

// Quota is the calendar quota script: units per day or month in a time
// zone.
//
//go:embed quota.lua
var Quota string

// TokenBucket is the token bucket script.
//
//go:embed token_bucket.lua
var TokenBucket string

// MeterBooking is the reservations and blocks of TokenBucket and GCRA,
// whose decisions are in their own scripts.
//
//go:embed meter_booking.lua
var MeterBooking string

// LeakyBucket is the leaky bucket (policing) script.
//
//go:embed leaky_bucket.lua
var LeakyBucket string

// GCRA is the generic cell rate algorithm script.
//
//go:embed gcra.lua
var GCRA string

// MeterStart is a worker task's start under a TokenBucket or GCRA rule:
// its capacity, and the instant tasks actually start.
//
//go:embed meter_start.lua
var MeterStart string

// MeterClaim is the start of a worker task that waits in a room, under a
// TokenBucket or GCRA rule: at a slot the meter admits, or not at all.
//
//go:embed meter_claim.lua
var MeterClaim string

// Room is the waiting room of a TokenBucket or GCRA key of the worker.
//
//go:embed room.lua
var Room string

// Lane is the worker's return lane: a task sent back is moved to the head
// of its asynq queue at its turn.
//
//go:embed lane.lua
var Lane string

// Concurrency is the concurrency limiter's script: holders of a key kept
// in a sorted set scored by lease expiry.
//
//go:embed concurrency.lua
var Concurrency string

// ThrottledTask is the worker's per-task throttle counter, for give-up
// policies.
//
//go:embed throttled_task.lua
var ThrottledTask string

// TickClaim is the scheduler's claim on one tick of an entry.
//
//go:embed tick_claim.lua
var TickClaim string

// Block sets a key's block, which every limiter script checks (KEYS[2]).
//
//go:embed block.lua
var Block string

// Source returns the full text of a script as Redis runs it: the opening
// of [Common] (its constants), then the helpers of Common the algorithm's
// file calls, directly or through another helper, in Common's order, then
// the file itself. Leaving the others out matters: Redis runs the whole
// text on every call, and each helper defined is a closure made each time.
func Source(algorithm string) string {
	need := map[string]bool{}
	var visit func(text string)
	visit = func(text string) {
		for _, h := range commonHelpers {
			if !need[h.name] && h.call.MatchString(text) {
				need[h.name] = true
				visit(h.text)
			}
		}
	}
	visit(algorithm)
	var b strings.Builder
	b.WriteString(commonOpening)
	for _, h := range commonHelpers {
		if need[h.name] {
			b.WriteString(h.text)
		}
	}
	b.WriteString("\n")
	b.WriteString(algorithm)
	return b.String()
}

// helper is one local function of Common, with the comment above it.
type helper struct {
	name string
	text string
	call *regexp.Regexp // a call of it
}

// Common, cut into its opening and its helpers.
var commonOpening, commonHelpers = splitCommon(Common)

// splitCommon cuts common.lua before each "local function", keeping each
// function's comment lines with it.
func splitCommon(common string) (string, []helper) {
	lines := strings.SplitAfter(common, "\n")
	var starts []int
	for i, line := range lines {
		if strings.HasPrefix(line, "local function ") {
			start := i
			for start > 0 && strings.HasPrefix(lines[start-1], "--") {
				start--
			}
			starts = append(starts, start)
		}
	}
	if len(starts) == 0 {
		return common, nil
	}
	helpers := make([]helper, len(starts))
	for j, start := range starts {
		end := len(lines)
		if j+1 < len(starts) {
			end = starts[j+1]
		}
		text := strings.Join(lines[start:end], "")
		name := text[strings.Index(text, "local function ")+len("local function "):]
		name = name[:strings.IndexByte(name, '(')]
		helpers[j] = helper{name: name, text: text, call: regexp.MustCompile(`\b` + name + `\(`)}
	}
	return strings.Join(lines[:starts[0]], ""), helpers
}
