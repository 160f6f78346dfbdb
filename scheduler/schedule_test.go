package scheduler

import (
	"testing"
	"time"
)

// TestEveryTicksAlikeOnEveryReplica: "@every d" ticks at the multiples of d
// since the Unix epoch, so replicas started at different moments tick at
// the same instants (robfig's own @every counts from each start).
func TestEveryTicksAlikeOnEveryReplica(t *testing.T) {
	schedule, err := parseSpec("@every 7s", time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	base := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	var first []time.Time
	for _, started := range []time.Duration{300 * time.Millisecond, 3 * time.Second, 6999 * time.Millisecond} {
		next := schedule.Next(base.Add(started))
		var ticks []time.Time
		for range 5 {
			if next.Unix()%7 != 0 || next.Nanosecond() != 0 {
				t.Fatalf("started at +%s: a tick at %s, not a multiple of 7 s since the epoch", started, next)
			}
			ticks = append(ticks, next)
			next = schedule.Next(next)
		}
		if first == nil {
			first = ticks
			continue
		}
		for i := range ticks {
			if !ticks[i].Equal(first[i]) && !ticks[i].Equal(first[i].Add(7*time.Second)) {
				t.Fatalf("started at +%s: ticks %v; a replica started earlier ticks at %v", started, ticks, first)
			}
		}
	}
	if keep := doneKeep(schedule, base); keep != 10*time.Minute {
		t.Fatalf("a 7 s entry remembers a finished tick %s; want 10 minutes", keep)
	}
	daily, _ := parseSpec("0 2 * * *", time.UTC)
	if keep := doneKeep(daily, base); keep != 24*time.Hour {
		t.Fatalf("a daily entry remembers a finished tick %s; want a day", keep)
	}
}

// TestSpecsAreReadInTheLocationGiven: a spec without CRON_TZ= is read in
// the scheduler's location, a fixed zone (time.FixedZone, which no parser
// can load by name) as well as a named one; a spec that names its zone
// keeps it.
func TestSpecsAreReadInTheLocationGiven(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	from := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		spec string
		loc  *time.Location
		want time.Time
	}{
		{"0 2 * * *", time.FixedZone("UTC+2", 2*3600), time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)},
		{"@daily", time.FixedZone("UTC-5", -5*3600), time.Date(2026, 12, 6, 5, 0, 0, 0, time.UTC)},
		{"0 2 * * *", berlin, time.Date(2026, 12, 6, 1, 0, 0, 0, time.UTC)},
		{"CRON_TZ=Asia/Tokyo 0 2 * * *", time.FixedZone("UTC+2", 2*3600), time.Date(2026, 12, 5, 17, 0, 0, 0, time.UTC)},
	} {
		schedule, err := parseSpec(tc.spec, tc.loc)
		if err != nil {
			t.Errorf("%q in %s: %v", tc.spec, tc.loc, err)
			continue
		}
		if got := schedule.Next(from); !got.Equal(tc.want) {
			t.Errorf("%q in %s: next after %s is %s; want %s", tc.spec, tc.loc, from, got.UTC(), tc.want)
		}
	}
}
