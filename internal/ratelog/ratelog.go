// Package ratelog keeps a log line that repeats, such as one per failed
// call while Redis is away, to at most one per interval.
package ratelog

import (
	"sync"
	"time"
)

// Every lets one line through per interval and counts those it holds back.
// The zero value lets the first line through. Safe for concurrent use.
type Every struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// Allow reports whether a line due at now is to be written, at least
// interval after the last one written, and how many were held back since.
func (e *Every) Allow(now time.Time, interval time.Duration) (ok bool, suppressed int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.last.IsZero() && now.Sub(e.last) < interval {
		e.suppressed++
		return false, 0
	}
	suppressed = e.suppressed
	e.last, e.suppressed = now, 0
	return true, suppressed
}
