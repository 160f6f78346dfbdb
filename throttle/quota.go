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
	// hours on the days its clocks change.
	Day Period = iota + 1
	// Month runs from midnight on the first of a month to midnight on the
	// first of the next, in the quota's Location.
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
			return time.Date(local.Year(), local.Month()+time.Month(step), 1, 0, 0, 0, 0, loc)
		}
	} else {
		start = func(step int) time.Time {
			return time.Date(local.Year(), local.Month(), local.Day()+step, 0, 0, 0, 0, loc)
		}
	}
	bounds := make([]any, 0, 4)
	for step := -1; step <= 2; step++ {
		bounds = append(bounds, itoa(start(step).UnixMicro()))
	}
	return bounds
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
