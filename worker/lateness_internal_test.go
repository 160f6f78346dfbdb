package worker

import (
	"testing"
	"time"
)

// TestLateness: the figure is the largest delay seen, at most the bound,
// fading by half every half-life; an early or punctual release adds
// nothing; a later, larger delay takes over.
func TestLateness(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const most = 200 * time.Millisecond
	steps := []struct {
		name    string
		due     time.Duration // from start
		now     time.Duration
		want    time.Duration // current at now
		epsilon time.Duration
	}{
		{"nothing seen", 0, 0, 0, 0},
		{"early", 100 * time.Millisecond, 50 * time.Millisecond, 0, 0},
		{"80ms late", time.Second, time.Second + 80*time.Millisecond, 80 * time.Millisecond, 0},
		// the 80 ms seen 930 ms before, faded by 2^(-0.93/5)
		{"a smaller delay adds nothing", 2 * time.Second, 2*time.Second + 10*time.Millisecond, 70 * time.Millisecond, time.Millisecond},
		{"a half-life later", 0, time.Second + 80*time.Millisecond + latenessHalfLife, 40 * time.Millisecond, time.Millisecond},
		{"beyond the bound", 10 * time.Second, 20 * time.Second, most, 0},
		{"long after", 0, 20*time.Second + 20*latenessHalfLife, 0, 0},
	}
	var l lateness
	for _, s := range steps {
		now := start.Add(s.now)
		if s.due != 0 {
			l.observe(start.Add(s.due), now, most)
		}
		got := l.current(now)
		if diff := got - s.want; diff < -s.epsilon || diff > s.epsilon {
			t.Errorf("%s: %s; want %s", s.name, got, s.want)
		}
	}
}
