package scheduler

import "time"

// clock is where a Scheduler reads the time and waits for it: the real
// clock, or in tests one they drive, so that a test of ticks need not sleep
// through them.
type clock interface {
	Now() time.Time
	// After returns a channel that receives once d has passed.
	After(d time.Duration) <-chan time.Time
}

// realClock is the process's clock.
type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }
