package worker

import (
	"testing"
	"time"
)

func TestDelayUntilLandsOnTheWholeSecondAfter(t *testing.T) {
	base := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		until, now time.Time
		stored     time.Time // what asynq keeps: (now + delay), whole seconds down
	}{
		{base.Add(2500 * time.Millisecond), base.Add(700 * time.Millisecond), base.Add(3 * time.Second)},
		{base.Add(3 * time.Second), base.Add(700 * time.Millisecond), base.Add(3 * time.Second)},
		{base.Add(3*time.Second + time.Nanosecond), base, base.Add(4 * time.Second)},
		{base.Add(-time.Second), base, base}, // already due: at once
	} {
		d := delayUntil(tc.until, tc.now)
		// asynq reads its clock a little after ours: up to 900ms later keeps
		// the same second.
		for _, lag := range []time.Duration{0, 100 * time.Millisecond, 900 * time.Millisecond} {
			stored := time.Unix(tc.now.Add(lag).Add(d).Unix(), 0).UTC()
			if !stored.Equal(tc.stored) && !(tc.until.Before(tc.now) && !stored.After(tc.now.Add(lag))) {
				t.Errorf("until %s, now %s, lag %s: asynq stores %s, want %s", tc.until, tc.now, lag, stored, tc.stored)
			}
			if !tc.until.Before(tc.now) && stored.Before(tc.until) {
				t.Errorf("until %s: stored %s is early", tc.until, stored)
			}
		}
	}
}
