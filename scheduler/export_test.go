package scheduler

import "time"

// SetClock makes s read the time from c and wait on it: tests drive their
// ticks instead of sleeping through them. Call it before Start.
func SetClock(s *Scheduler, c interface {
	Now() time.Time
	At(t time.Time) <-chan time.Time
}) {
	s.clock = c
}

// Timings of the claims, for tests that drive the clock past them.
const (
	ClaimLease   = claimLease
	RecoverEvery = recoverEvery
)
