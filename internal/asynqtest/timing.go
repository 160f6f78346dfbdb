package asynqtest

import (
	"slices"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/worker"
)

// StartJitter is how much later than its admission a handler may start on
// this process's clock. The library promises admissions decided on the
// Redis server's clock, and tests assert those strictly (see Slots). A
// handler's start comes later than its admission by the time a timer, the
// Go scheduler and asynq's goroutines take to run it: on a busy 2-core
// machine under the race detector, not a constant. Tests that check starts
// on the wall clock allow StartJitter for it.
//
// Measured on the 2-core machines this project runs on, with two other
// processes keeping both cores busy (yes > /dev/null, twice), under -race,
// from the figures lines of TestFleetHoldsTheRate, TestPaceSpreadsABatch
// and the root TestEndToEnd (start minus admission, per task): over three
// runs of the whole suite the latest start came 62 ms after its admission
// (500 paced tasks at 100/s on 60 workers), the others at most 21 ms; the
// medians 2 to 11 ms. StartJitter is about two and a half times the most.
// In CI, where two test passes run at once (.ci/run's lanes), the latest
// starts of four runs came 37 to 63 ms after their admissions; in a later
// one (2026-12-03) the embedded pass, running alone, saw a start 154 ms
// after its admission in TestFleetHoldsTheRate (p99 104 ms, median 6 ms),
// above the 150 ms this was then. StartJitter is about one and a half
// times that most.
const StartJitter = 250 * time.Millisecond

// ArrivalJitter is how much later than its slot an outbound request may
// reach an upstream on this process's clock: a timer, the Go scheduler, a
// connection pool and a loopback socket lie between. Measured as
// StartJitter is, from the figures of httpthrottle's
// TestTwoClientsShareTheLimit and the root TestEndToEnd: the latest arrival
// came 38 ms after its slot, the medians 4 to 7 ms. In CI, where two test
// passes run at once (.ci/run's lanes), the latest arrivals of four runs
// came 26, 39, 53 and 114 ms after their slots. ArrivalJitter is about two
// and a half times that 114 ms, rounded.
const ArrivalJitter = 250 * time.Millisecond

// CheckArrivals checks the arrivals of requests sent at booked slots (on
// the Redis clock) against a limit of most in any window w, as CheckHeld
// does for runs: strictly on the slots, and with ArrivalJitter allowed on
// this process's clock. Requests leave in the order of their slots, so the
// i-th arrival is the i-th slot's request; slots given back unused come
// last. It logs a figures line.
func CheckArrivals(t testing.TB, name string, arrivals, slots []time.Time, offset, w time.Duration, most int) {
	t.Helper()
	arrivals, slots = sortedTimes(arrivals), sortedTimes(slots)
	if n := MostInAnyTimeWindow(slots, w); n > most {
		t.Errorf("%s: %d slots within %s on the Redis clock; the limit allows %d", name, n, w, most)
	}
	if len(slots) < len(arrivals) {
		t.Fatalf("%s: %d requests arrived for %d slots booked", name, len(arrivals), len(slots))
	}
	var late []time.Duration
	for i, at := range arrivals {
		late = append(late, at.Sub(slots[i].Add(-offset)))
	}
	least, median, p99, longest := Spread(late)
	if least < -5*time.Millisecond || longest > ArrivalJitter {
		t.Errorf("%s: requests arrived from %s to %s after their slots; allowed: 0 to %s (ArrivalJitter)", name, least, longest, ArrivalJitter)
	}
	if n := MostInAnyTimeWindow(arrivals, w-ArrivalJitter); n > most {
		t.Errorf("%s: %d requests arrived within %s; the limit allows %d", name, n, w-ArrivalJitter, most)
	}
	t.Logf("figures: %s: %d requests, most slots in any %s: %d (limit %d); arrival after slot: least %s, median %s, p99 %s, most %s",
		name, len(arrivals), w, MostInAnyTimeWindow(slots, w), most, least.Round(time.Microsecond), median.Round(time.Microsecond),
		p99.Round(time.Microsecond), longest.Round(time.Microsecond))
}

func sortedTimes(at []time.Time) []time.Time {
	s := slices.Clone(at)
	slices.SortFunc(s, func(a, b time.Time) int { return a.Compare(b) })
	return s
}

// Slots returns, for each run whose admission an event reported, the
// admission on the Redis clock (worker.Event.Slot), keyed by asynq's ID
// of the message run.
func (e *Events) Slots() map[string]time.Time {
	slots := map[string]time.Time{}
	for _, ev := range e.All() {
		if (ev.Kind == worker.Admitted || ev.Kind == worker.WaitedInline) && !ev.Slot.IsZero() {
			slots[ev.TaskID] = ev.Slot
		}
	}
	return slots
}

// Lateness returns how long after its admission each run started: its
// start on this clock minus its Slot brought to this clock with offset
// (see redistest.ClockOffset), for the runs that have a Slot, in the runs' order.
func Lateness(runs []Run, slots map[string]time.Time, offset time.Duration) []time.Duration {
	var late []time.Duration
	for _, r := range runs {
		if slot, ok := slots[r.TaskID]; ok {
			late = append(late, r.At.Sub(slot.Add(-offset)))
		}
	}
	return late
}

// Spread summarises durations: the least, the median, the 99th percentile
// and the most.
func Spread(d []time.Duration) (least, median, p99, most time.Duration) {
	if len(d) == 0 {
		return
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[0], s[len(s)/2], s[(len(s)*99)/100], s[len(s)-1]
}

// MostInAnyTimeWindow returns the most instants within any closed window
// of length w.
func MostInAnyTimeWindow(at []time.Time, w time.Duration) int {
	s := sortedTimes(at)
	most := 0
	for i := range s {
		j := i
		for j < len(s) && s[j].Sub(s[i]) <= w {
			j++
		}
		most = max(most, j-i)
	}
	return most
}

// CheckHeld checks runs of one key of a rule against the rule's limit of
// most in any window w: strictly on the Redis clock, where the limiter
// admitted them (every run must have an admission in slots); and on this
// process's clock, where the handlers started, with StartJitter allowed:
// no run starts more than StartJitter after its admission, so no window of
// w less StartJitter holds more than most starts. It logs a figures line
// with the lateness of the starts.
func CheckHeld(t testing.TB, runs []Run, slots map[string]time.Time, offset, w time.Duration, most int) {
	t.Helper()
	var admitted []time.Time
	for _, r := range runs {
		slot, ok := slots[r.TaskID]
		if !ok {
			t.Errorf("run of %s (message %s) has no admission reported", r.ID, r.TaskID)
			continue
		}
		admitted = append(admitted, slot)
	}
	if n := MostInAnyTimeWindow(admitted, w); n > most {
		t.Errorf("%d admissions within %s on the Redis clock; the limit allows %d", n, w, most)
	}
	late := Lateness(runs, slots, offset)
	least, median, p99, longest := Spread(late)
	if longest > StartJitter || least < -5*time.Millisecond {
		t.Errorf("handlers started from %s to %s after their admissions; allowed: 0 to %s (StartJitter)", least, longest, StartJitter)
	}
	if n := MostInAnyWindow(runs, w-StartJitter); n > most {
		t.Errorf("%d handlers started within %s (%s less StartJitter); the limit allows %d", n, w-StartJitter, w, most)
	}
	t.Logf("figures: %d runs, most admissions in any %s: %d (limit %d); start after admission: least %s, median %s, p99 %s, most %s",
		len(runs), w, MostInAnyTimeWindow(admitted, w), most, least.Round(time.Microsecond), median.Round(time.Microsecond),
		p99.Round(time.Microsecond), longest.Round(time.Microsecond))
}

// Admission is units admitted at an instant on the Redis clock.
type Admission struct {
	At    time.Time
	Units int
}

// CheckMeterUnits fails the test when, from one admission to another, more
// units were admitted than a meter of rate and burst allows: burst plus
// rate times the span between them, on the Redis clock, where the limiter
// decided. It sorts admitted.
func CheckMeterUnits(t testing.TB, admitted []Admission, rate throttle.Rate, burst int) {
	t.Helper()
	slices.SortFunc(admitted, func(a, b Admission) int { return a.At.Compare(b.At) })
	for i := range admitted {
		sum := 0
		for j := i; j < len(admitted); j++ {
			sum += admitted[j].Units
			span := admitted[j].At.Sub(admitted[i].At)
			if allowed := burst + int(span*time.Duration(rate.N)/rate.Per); sum > allowed {
				t.Fatalf("%d units admitted within %s on the Redis clock; %s with a burst of %d allows %d", sum, span, rate, burst, allowed)
			}
		}
	}
}
