package scheduler

import "time"

// clock is where a Scheduler reads the time and waits for it: the real
// clock, or in tests one they drive, so that a test of ticks need not sleep
// through them.
type clock interface {
	Now() time.Time
	// At returns a channel that receives once the clock has reached t:
	// an instant, not a duration, so that a wait is not lengthened by the
	// time between reading the clock and asking.
	At(t time.Time) <-chan time.Time
}

// realClock is the process's clock.
type realClock struct{}

func (realClock) Now() time.Time                  { return time.Now() }
func (realClock) At(t time.Time) <-chan time.Time { return time.After(time.Until(t)) }
