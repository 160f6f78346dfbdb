package throttle

import (
	"fmt"
	"strings"
	"time"
)

var quotaScript = limiterScript("quota")

// Period is the calendar period of a [Quota].
type Period int

// The periods a Quota counts in.
const (
	// Day runs from midnight to midnight in the quota's Location: 23 or 25
	// hours on the days its clocks change. Where the clocks skip midnight
	// (from 23:59:59 straight to 01:00), the day starts at its first
	// instant, 01:00.
	Day Period = iota + 1
	// Month runs from midnight on the first of a month to midnight on the
	// first of the next, in the quota's Location (from the first instant of
	// the first, where its midnight is skipped).
	Month
)

// String returns "day" or "month".
func (p Period) String() string {
	switch p {
	case Day:
		return "day"
	case Month:
		return "month"
	}
	return fmt.Sprintf("Period(%d)", int(p))
}

// Quota admits at most Limit units per calendar day or month, which turn at
// midnight in Location: a partner's daily quota that resets at midnight in
// its own zone. The periods follow the zone's calendar, daylight saving
// time included, and the time is Redis's: a rejection's RetryAfter is the
// time left until the period turns. State is one small key per caller key.
// Like any fixed window, a quota lets a full Limit through either side of
// the turn.
type Quota struct {
	Limit    int            // units per period, 1 to 2^50
	Period   Period         // Day or Month
	Location *time.Location // where midnight is; nil for UTC
}

// Validate implements [Policy].
func (p Quota) Validate() error {
	if p.Limit < 1 {
		return invalidPolicy("Quota.Limit must be at least 1, got %d", p.Limit)
	}
	if int64(p.Limit) > maxExact {
		return invalidPolicy("Quota.Limit must be at most 2^50 to be counted exactly, got %d", p.Limit)
	}
	if p.Period != Day && p.Period != Month {
		return invalidPolicy("Quota.Period must be Day or Month, got %s", p.Period)
	}
	return nil
}

// String returns the policy's short form, which ParsePolicy reads back:
// "quota:1000/day:Europe/Paris".
func (p Quota) String() string {
	return fmt.Sprintf("quota:%d/%s:%s", p.Limit, p.Period, p.location())
}

func (p Quota) location() *time.Location {
	if p.Location == nil {
		return time.UTC
	}
	return p.Location
}

func (p Quota) spec() spec {
	return spec{
		kind:     "quota",
		id:       p.String(),
		script:   quotaScript,
		capacity: p.Limit,
		args:     boxArgs(itoa(int64(p.Limit))),
		calendar: p.bounds,
	}
}

// bounds returns, as script arguments, the bounds of the period around at
// and of the periods either side of it.
func (p Quota) bounds(at time.Time) []any {
	loc := p.location()
	local := at.In(loc)
	var start func(step int) time.Time
	if p.Period == Month {
		start = func(step int) time.Time {
			return firstInstant(local.Year(), local.Month()+time.Month(step), 1, loc)
		}
	} else {
		start = func(step int) time.Time {
			return firstInstant(local.Year(), local.Month(), local.Day()+step, loc)
		}
	}
	bounds := make([]any, 0, 4)
	for step := -1; step <= 2; step++ {
		bounds = append(bounds, itoa(start(step).UnixMicro()))
	}
	return bounds
}

// firstInstant returns the first instant of a date in loc (the date is
// normalised as time.Date does: day 0 is the last of the month before). It
// is midnight, unless the clocks skip midnight on that date: time.Date then
// gives an instant of the day before (23:00 where the clocks go from 00:00
// to 01:00) or after the skip, and the day starts when the skip ends. Where
// midnight comes twice (clocks set back to 00:00), it is the first.
func firstInstant(year int, month time.Month, day int, loc *time.Location) time.Time {
	at := time.Date(year, month, day, 0, 0, 0, 0, loc)
	// date is normalised; at is on loc's clock
	date := time.Date(year, month, day, 0, 0, 0, 0, time.UTC)
	if localDate(at).Before(date) {
		// midnight was skipped: the day starts where the zone in force at
		// at ends
		if _, end := at.ZoneBounds(); !end.IsZero() {
			return end
		}
		return at
	}
	// An earlier instant of the same date, in the zone before this one?
	begin, _ := at.ZoneBounds()
	if begin.IsZero() {
		return at
	}
	_, offset := begin.Add(-time.Nanosecond).Zone()
	earlier := date.Add(-time.Duration(offset) * time.Second)
	if earlier.Before(begin) && localDate(earlier.In(loc)).Equal(date) {
		return earlier
	}
	return at
}

// localDate returns t's date on its own clock, as midnight UTC.
func localDate(t time.Time) time.Time {
	return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
}

// parseQuota reads "LIMIT/day" or "LIMIT/month", then ":ZONE" (UTC
// without).
func parseQuota(s string) (Quota, error) {
	count, zone, _ := strings.Cut(s, ":")
	limit, period, ok := strings.Cut(count, "/")
	if !ok {
		return Quota{}, fmt.Errorf("want LIMIT/day or LIMIT/month, then :ZONE, e.g. 1000/day:Europe/Paris, got %q", s)
	}
	n, err := parseInt(limit)
	if err != nil {
		return Quota{}, err
	}
	q := Quota{Limit: n}
	switch period {
	case "day":
		q.Period = Day
	case "month":
		q.Period = Month
	default:
		return Quota{}, fmt.Errorf("the period is day or month, got %q", period)
	}
	if zone != "" && zone != "UTC" {
		if q.Location, err = time.LoadLocation(zone); err != nil {
			return Quota{}, fmt.Errorf("time zone %q: %w", zone, err)
		}
	}
	return q, nil
}

// Compile-time check.
var _ Policy = Quota{}
