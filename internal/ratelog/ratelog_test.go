package ratelog

import (
	"testing"
	"time"
)

// TestEveryLetsOneLineThroughPerInterval: the first line goes through, the
// ones within the interval after it are held back and counted, and the next
// one after it goes through with that count.
func TestEveryLetsOneLineThroughPerInterval(t *testing.T) {
	var e Every
	start := time.Unix(1_800_000_000, 0)
	for _, step := range []struct {
		at         time.Duration
		ok         bool
		suppressed int
	}{
		{0, true, 0},
		{time.Second, false, 0},
		{9 * time.Second, false, 0},
		{10 * time.Second, true, 2},
		{11 * time.Second, false, 0},
		{25 * time.Second, true, 1},
	} {
		ok, suppressed := e.Allow(start.Add(step.at), 10*time.Second)
		if ok != step.ok || suppressed != step.suppressed {
			t.Fatalf("at +%s: %v, %d held back; want %v, %d", step.at, ok, suppressed, step.ok, step.suppressed)
		}
	}
}
