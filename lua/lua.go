// Package lua holds jobthrottle's Redis scripts as readable .lua files,
// embedded into the binary with go:embed.
//
// Each algorithm's file opens with a header naming its KEYS, ARGV and
// return value. [Common] holds helpers shared by all of them; package
// throttle runs each script as Common followed by the algorithm's own file
// (see [Source]), so the text Redis receives is self-contained.
//
// Every script reads the clock with redis.call('TIME'), declares the single
// key it touches in KEYS, gives every key it writes an expiry, and returns
// integers only. Package lua has no code beyond the embedding and is safe
// for concurrent use.
package lua

import _ "embed"

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

// TokenBucket is the token bucket script.
//
//go:embed token_bucket.lua
var TokenBucket string

// LeakyBucket is the leaky bucket (policing) script.
//
//go:embed leaky_bucket.lua
var LeakyBucket string

// GCRA is the generic cell rate algorithm script.
//
//go:embed gcra.lua
var GCRA string

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

// Source returns the full text of a script as Redis runs it: [Common]
// followed by the algorithm's own file.
func Source(algorithm string) string {
	return Common + "\n" + algorithm
}
