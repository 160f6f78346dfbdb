package throttle

import (
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	fixedWindowScript   = limiterScript("fixed_window")
	slidingLogScript    = limiterScript("sliding_log")
	slidingWindowScript = limiterScript("sliding_window")
)

// FixedWindow admits at most Limit units per window, the windows aligned to
// the Unix epoch (a one-minute window starts at every whole minute, on the
// Redis server's clock). State is one small key per caller key.
//
// Two full bursts either side of a window boundary pass: up to 2×Limit
// units can be admitted within one window's length. Choose [SlidingLog] or
// [GCRA] when that matters.
type FixedWindow struct {
	Limit  int           // units per window, 1 to 2^50
	Window time.Duration // window length, 1 ms to 10 years, whole µs
}

// Validate implements [Policy].
func (p FixedWindow) Validate() error { return validateWindow("FixedWindow", p.Limit, p.Window) }

func (p FixedWindow) spec() spec {
	return windowSpec("fw", fixedWindowScript, p.Limit, p.Window)
}

// SlidingLog admits at most Limit units in any window of the given length,
// exactly: it keeps one sorted-set entry per admitted unit, so its memory
// per key grows with Limit (about 50–70 bytes per entry), and a request
// for n units writes n entries in one script, during which Redis serves
// no one else. Choose it for small limits that must never be exceeded in
// any interval; Limit is at most 10,000 (a full AllowN of 10,000 holds
// Redis for a few milliseconds). For larger limits use [SlidingWindow] or
// [GCRA], whose cost does not grow with the limit.
type SlidingLog struct {
	Limit  int           // units in any window, 1 to 10,000
	Window time.Duration // window length, 1 ms to 10 years, whole µs
}

// maxLogLimit is the largest SlidingLog.Limit: it bounds the entries one
// script writes or removes, and so how long it holds Redis.
const maxLogLimit = 10_000

// Validate implements [Policy].
func (p SlidingLog) Validate() error {
	if err := validateWindow("SlidingLog", p.Limit, p.Window); err != nil {
		return err
	}
	if p.Limit > maxLogLimit {
		return invalidPolicy("SlidingLog.Limit must be at most %d (one entry per unit is kept and written in one script), got %d; use SlidingWindow or GCRA for larger limits", maxLogLimit, p.Limit)
	}
	return nil
}

func (p SlidingLog) spec() spec {
	return windowSpec("sl", slidingLogScript, p.Limit, p.Window)
}

// SlidingWindow approximates a sliding window with two counters: the
// previous fixed window's count weighted by how much of it the sliding
// window still covers, plus the current one's. O(1) memory like
// [FixedWindow], without its 2× burst at boundaries; the estimate assumes
// the previous window's units were spread evenly, so it can admit slightly
// more or fewer than an exact log would.
type SlidingWindow struct {
	Limit  int           // units per window, 1 to 2^50
	Window time.Duration // window length, 1 ms to 10 years, whole µs
}

// Validate implements [Policy].
func (p SlidingWindow) Validate() error {
	if err := validateWindow("SlidingWindow", p.Limit, p.Window); err != nil {
		return err
	}
	if units := p.Window.Microseconds() / weightUnit(p.Window); int64(p.Limit) > maxExact/units {
		return invalidPolicy("SlidingWindow.Limit × Window is too large to weigh exactly (limit %d over %s)", p.Limit, p.Window)
	}
	return nil
}

func (p SlidingWindow) spec() spec {
	s := windowSpec("sw", slidingWindowScript, p.Limit, p.Window)
	s.args = append(s.args, itoa(weightUnit(p.Window)))
	return s
}

// weightUnit is the resolution, in microseconds, at which SlidingWindow
// weighs the previous window: a millisecond when the window is whole
// milliseconds, which lets long windows carry large limits.
func weightUnit(window time.Duration) int64 {
	if window%time.Millisecond == 0 {
		return 1000
	}
	return 1
}

func validateWindow(name string, limit int, window time.Duration) error {
	if limit < 1 {
		return invalidPolicy("%s.Limit must be at least 1, got %d", name, limit)
	}
	if int64(limit) > maxExact {
		return invalidPolicy("%s.Limit must be at most 2^50 to be counted exactly, got %d", name, limit)
	}
	return checkSpan(name+".Window", window, time.Millisecond)
}

func windowSpec(kind string, script *redis.Script, limit int, window time.Duration) spec {
	return spec{
		kind:     kind,
		id:       fmt.Sprintf("%s:%d/%s", kind, limit, window),
		script:   script,
		capacity: limit,
		args:     boxArgs(itoa(int64(limit)), itoa(window.Microseconds())),
	}
}
