// Package fleet is the layout in Redis of the fleet's counts for the
// dashboard: written by a dashboard.Publisher's flush ([Flush]), read back
// by the dashboard's handler (the other functions). Every function is safe
// for concurrent use.
//
// With P the key prefix, L the limiter's name as a Cluster hash tag
// (keyspace.Tag), M a minute (Unix seconds / 60 on the Redis server's
// clock) and S a second in it (0 to 59):
//
//	P dash: L :s: M             HASH  "Sa", "St", "Sr": admitted, throttled,
//	                                  rescheduled in second S, all keys
//	P dash: L :k: M : escaped   HASH  the same for one caller key
//	                                  (keyspace.Escape), and "p" =
//	                                  "policy|source" of a policy not the code's
//	P dash: L :h: M             ZSET  caller key → held back (throttled:
//	                                  a task sent back was first) in the minute
//	P dash: L :a: M             ZSET  caller key → admitted in the minute
//	P dash: L :u: by            ZSET  Ranked's union of the minutes (10 s)
//	P dash:limiters             HASH  limiter name → {"kind","code_policy","seen_ms"}
//	P dash:procs                ZSET  process name → Unix ms of its last flush
//
// The per-minute keys expire 17 minutes after their last write, the
// limiters' hash 24 hours after, the processes' set an hour after. All of a
// limiter's counts share its hash tag, so one Cluster slot.
package fleet

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/redis/go-redis/v9"
)

// Lifetimes of the keys.
const (
	// MinuteTTL is how long a minute's counts live after their last write:
	// the dashboard's 15 minutes, and two more for late flushes and clocks.
	MinuteTTL = 17 * time.Minute
	// Window is how far back counts are kept and read: the dashboard's
	// charts.
	Window = 15 * time.Minute
	// LimitersTTL is how long the limiters' hash lives after a flush.
	LimitersTTL = 24 * time.Hour
	// ProcsTTL is how long the processes' set lives after a flush.
	ProcsTTL = time.Hour
	// ProcsKept is how long a process stays in the processes' set after its
	// last flush.
	ProcsKept = 10 * time.Minute
	// UnionTTL is how long Ranked's union lives.
	UnionTTL = 10 * time.Second
	// MaxSpan is the longest span the series readers accept.
	MaxSpan = 24 * time.Hour
)

// ErrSpan reports a series asked for over more than MaxSpan.
var ErrSpan = errors.New("dashboard: series span longer than 24h")

// Limiter is a limiter some process has published counts for.
type Limiter struct {
	Name string
	// Kind is "rate" or "concurrency".
	Kind string
	// CodePolicy is the policy the limiter was created with, in short
	// form; empty when no process has seen it (always, for concurrency).
	CodePolicy string
	// Seen is when a process last published the limiter (Redis clock).
	Seen time.Time
}

// Process is one publishing process.
type Process struct {
	Name string
	// Seen is its last flush, on the Redis clock.
	Seen time.Time
}

// Point is one second of counts.
type Point struct {
	At                               time.Time
	Admitted, Throttled, Rescheduled int64
}

// KeyActivity is one caller key's counts over a span.
type KeyActivity struct {
	Key      string
	Admitted int64
	// HeldBack is throttled (a rescheduled task was throttled first).
	HeldBack int64
}

// Rank says what Ranked ranks keys by.
type Rank int

const (
	// HeldBack ranks by throttled.
	HeldBack Rank = iota
	// Admitted ranks by admitted.
	Admitted
)

func (r Rank) String() string {
	if r == Admitted {
		return "admitted"
	}
	return "held"
}

// Now returns the Redis server's clock (TIME; on a Cluster, a node's).
func Now(ctx context.Context, c redis.UniversalClient) (time.Time, error) {
	return c.Time(ctx).Result()
}

// Key names.

func limiterBase(prefix, limiter string) string {
	return prefix + "dash:" + keyspace.Tag(limiter)
}

func secondsKey(base string, minute int64) string {
	return base + ":s:" + strconv.FormatInt(minute, 10)
}

func callerKey(base string, minute int64, key string) string {
	return base + ":k:" + strconv.FormatInt(minute, 10) + ":" + keyspace.Escape(key)
}

func heldKey(base string, minute int64) string {
	return base + ":h:" + strconv.FormatInt(minute, 10)
}

func admittedKey(base string, minute int64) string {
	return base + ":a:" + strconv.FormatInt(minute, 10)
}

func unionKey(base string, by Rank) string {
	return base + ":u:" + by.String()
}

func limitersKey(prefix string) string { return prefix + "dash:limiters" }

func procsKey(prefix string) string { return prefix + "dash:procs" }

// minutes returns the minutes from the one holding from to the one holding
// the instant just before to.
func minutes(from, to time.Time) []int64 {
	first, last := floorDiv(from.Unix(), 60), floorDiv(to.Add(-time.Nanosecond).Unix(), 60)
	var out []int64
	for m := first; m <= last; m++ {
		out = append(out, m)
	}
	return out
}

// recentMinutes returns the minutes from since to now that may still hold
// counts.
func recentMinutes(since, now time.Time) []int64 {
	if oldest := now.Add(-MinuteTTL); since.Before(oldest) {
		since = oldest
	}
	return minutes(since, now.Add(time.Second))
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}
