package worker

import (
	"math"
	"sync"
	"time"
)

// lateness is how late the dispatcher has lately been for a room's turn:
// from when a release was due to when Redis answered it. A busy machine
// delays the dispatcher's timer, and a slow Redis its round trips; each
// delay would come off the time a released task has to reach a worker,
// or, once that time is down to the notice (see releaseNotice), off the
// meter's rate. The dispatcher lets waiters out earlier by its recent
// worst delay, so that a release due at a lead before its start still
// gives the task the full lead. The figure is the largest delay seen,
// fading by half every latenessHalfLife, and at most the lane's lead.
// It is safe for concurrent use.
type lateness struct {
	mu   sync.Mutex
	peak time.Duration
	at   time.Time // when peak was last set or faded
}

// latenessHalfLife is how fast a delay seen once fades from the figure.
const latenessHalfLife = 5 * time.Second

// observe records a release due at due that Redis answered at now.
func (l *lateness) observe(due, now time.Time, most time.Duration) {
	late := min(max(0, now.Sub(due)), most)
	l.mu.Lock()
	defer l.mu.Unlock()
	if peak := l.fadedLocked(now); late >= peak {
		l.peak, l.at = late, now
	}
}

// current returns the figure at now.
func (l *lateness) current(now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fadedLocked(now)
}

// fadedLocked fades the peak to now and returns it.
func (l *lateness) fadedLocked(now time.Time) time.Duration {
	if l.peak <= 0 {
		return 0
	}
	elapsed := now.Sub(l.at)
	if elapsed <= 0 {
		return l.peak
	}
	faded := time.Duration(float64(l.peak) * math.Exp2(-float64(elapsed)/float64(latenessHalfLife)))
	if faded < time.Millisecond {
		faded = 0
	}
	l.peak, l.at = faded, now
	return faded
}
