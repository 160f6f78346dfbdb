package lease

import "sync"

// Share is a process's side of one key's lease: a token bucket at the
// granted rate and burst that decides in memory until the lease ends
// locally, and the count of units asked that tells Redis the process's
// demand. Times are nanoseconds on the process's monotonic clock (see
// [Clock]). The zero value holds no lease. A Share is safe for concurrent
// use.
type Share struct {
	mu     sync.Mutex
	perNs  float64 // granted units per nanosecond
	burst  float64
	tokens float64
	last   int64 // when tokens were last brought up to date
	end    int64 // when the lease ends here: its request's sending plus the lease
	full   bool  // Grant.Full
	asked  float64
	since  int64
}

// Local is a decision a Share made in memory.
type Local struct {
	Held bool // a lease was in force: the decision is the Share's
	OK   bool // the units were admitted
	Full bool // the share is all the demand asked (see Grant.Full)
	// Tokens left after the decision, and the share's rate (units per
	// second) and burst: what a caller needs to say when to come back.
	Tokens, Rate, Burst float64
}

// Take decides n units at now. A Local that is not Held means no lease is
// in force: the caller decides elsewhere. Every call counts in the demand,
// held or not. Take allocates nothing.
func (s *Share) Take(now int64, n float64) Local {
	var d Local
	s.mu.Lock()
	s.asked += n
	if s.since == 0 {
		s.since = now // the first demand counts from the first request
	}
	if now < s.end {
		d.Held = true
		s.settle(now)
		if s.tokens >= n {
			s.tokens -= n
			d.OK = true
		}
		d.Tokens, d.Rate, d.Burst, d.Full = s.tokens, s.perNs*1e9, s.burst, s.full
	}
	s.mu.Unlock()
	return d
}

// Peek reports what Take would decide for n units at now, consuming
// nothing and counting nothing.
func (s *Share) Peek(now int64, n float64) Local {
	var d Local
	s.mu.Lock()
	if now < s.end {
		s.settle(now)
		d = Local{Held: true, OK: s.tokens >= n, Tokens: s.tokens, Rate: s.perNs * 1e9, Burst: s.burst}
	}
	s.mu.Unlock()
	return d
}

// settle refills the tokens up to now, never past the lease's end. The
// caller holds mu.
func (s *Share) settle(now int64) {
	now = min(now, s.end)
	if now > s.last {
		s.tokens = min(s.burst, s.tokens+float64(now-s.last)*s.perNs)
		s.last = now
	}
}

// Apply puts g in force at now; sent is when its request was sent. The
// tokens are kept while the lease in force has not ended (a lease that
// ended leaves none, as Redis counted nothing since), g's tokens are
// added, and the whole is cut to g's burst. A grant of nothing ends the
// lease at once.
func (s *Share) Apply(g Grant, sent, now int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now < s.end {
		s.settle(now)
	} else {
		s.tokens = 0
	}
	if g.Rate <= 0 || g.Burst <= 0 {
		s.perNs, s.burst, s.tokens, s.end = 0, 0, 0, 0
		return
	}
	s.perNs, s.burst, s.full = g.Rate/1e9, g.Burst, g.Full
	s.tokens, s.last = min(s.tokens+g.Tokens, g.Burst), now
	s.end = sent + g.Lease.Nanoseconds()
}

// Give returns n units taken at now under the lease in force (a caller
// that will not use them after all), never past the share's burst. With
// no lease in force it does nothing: Redis counted nothing of the lapsed
// lease's units.
func (s *Share) Give(now int64, n float64) {
	s.mu.Lock()
	if now < s.end {
		s.settle(now)
		s.tokens = min(s.burst, s.tokens+n)
	}
	s.mu.Unlock()
}

// Stop ends the lease here at once (before its share is released).
func (s *Share) Stop() {
	s.mu.Lock()
	s.perNs, s.burst, s.tokens, s.end = 0, 0, 0, 0
	s.mu.Unlock()
}

// Held reports whether a lease is in force at now.
func (s *Share) Held(now int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return now < s.end
}

// Demand returns the units per second asked since the last call (or the
// first Take) and starts counting again. Before any Take it is 0.
func (s *Share) Demand(now int64) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := 0.0
	if now > s.since && s.since > 0 {
		d = s.asked * 1e9 / float64(now-s.since)
	}
	s.asked, s.since = 0, now
	return d
}
