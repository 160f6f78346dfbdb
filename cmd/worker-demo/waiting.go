package main

import (
	"slices"
	"time"
)

// whileAllWaited measures the rates that fair sharing is about: those of
// the tenants while every one of them had a call waiting for the throttle,
// a call decided on (seen) and not yet admitted. A tenant whose calls are
// still in asynq's queue, behind the others' on a busy machine, cannot take
// its share, so those moments are left out, wherever in the run they come.
// seen and admitted are each tenant's first decisions and admissions on the
// Redis clock. It returns how long every tenant waited, in all, and how
// many calls of each were admitted in that time.
func whileAllWaited(tenants []string, seen, admitted map[string][]time.Time) (span time.Duration, got map[string]int) {
	type event struct {
		at     time.Time
		tenant int
		admit  bool
	}
	var events []event
	for i, t := range tenants {
		for _, at := range seen[t] {
			events = append(events, event{at, i, false})
		}
		for _, at := range admitted[t] {
			events = append(events, event{at, i, true})
		}
	}
	slices.SortFunc(events, func(a, b event) int { return a.at.Compare(b.at) })
	waiting := make([]int, len(tenants))
	allWait := func() bool {
		for _, w := range waiting {
			if w <= 0 {
				return false
			}
		}
		return true
	}
	// Events of one instant are taken together: their admissions count if
	// every tenant was waiting up to that instant (a call seen and
	// admitted at once did not wait).
	got = map[string]int{}
	for i := 0; i < len(events); {
		j := i
		for j < len(events) && events[j].at.Equal(events[i].at) {
			j++
		}
		counts := allWait()
		if counts && i > 0 {
			span += events[i].at.Sub(events[i-1].at)
		}
		for _, e := range events[i:j] {
			if e.admit {
				waiting[e.tenant]--
				if counts {
					got[tenants[e.tenant]]++
				}
			} else {
				waiting[e.tenant]++
			}
		}
		i = j
	}
	return span, got
}
