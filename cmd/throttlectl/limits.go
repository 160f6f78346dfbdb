package main

import (
	"cmp"
	"strconv"
	"strings"
	"time"

	"github.com/jobthrottle/jobthrottle/throttle"
)

// limits are a policy's numbers as peek and top show them beside a key's
// state: the rate and the burst of a GCRA or TokenBucket, the rate and
// capacity of a LeakyBucket, the limit and window of a window policy, the
// limit and period of a quota, the slots and lease of a concurrency cap.
// A field a policy does not have is zero.
type limits struct {
	algorithm string        // "gcra", "tb", "lb", "fw", "sl", "sw", "quota" or "conc"
	rate      string        // units per period, "10/1s"; a window's limit per window, "25/1m"; a quota's per period, "1000/day"
	perSecond float64       // the rate in units per second, on average for a window; 0 for a quota
	burst     int           // GCRA, TokenBucket: units admitted at once from rest
	capacity  int           // LeakyBucket: drops the bucket holds
	limit     int           // windows and quotas: units per window or period; concurrency caps: slots
	window    time.Duration // FixedWindow, SlidingLog, SlidingWindow
	period    string        // Quota: "day" or "month"
	lease     time.Duration // concurrency caps
}

// limitsOf returns p's numbers; for a policy it does not know, only the
// algorithm of p's short form.
func limitsOf(p throttle.Policy) limits {
	switch p := p.(type) {
	case throttle.GCRA:
		return limits{algorithm: "gcra", rate: rateText(p.Rate.N, p.Rate.Per), perSecond: perSecond(p.Rate.N, p.Rate.Per), burst: p.Burst}
	case throttle.TokenBucket:
		return limits{algorithm: "tb", rate: rateText(p.Rate.N, p.Rate.Per), perSecond: perSecond(p.Rate.N, p.Rate.Per), burst: p.Burst}
	case throttle.LeakyBucket:
		return limits{algorithm: "lb", rate: rateText(p.Rate.N, p.Rate.Per), perSecond: perSecond(p.Rate.N, p.Rate.Per), capacity: p.Capacity}
	case throttle.FixedWindow:
		return windowLimits("fw", p.Limit, p.Window)
	case throttle.SlidingLog:
		return windowLimits("sl", p.Limit, p.Window)
	case throttle.SlidingWindow:
		return windowLimits("sw", p.Limit, p.Window)
	case throttle.Quota:
		return limits{algorithm: "quota", rate: strconv.Itoa(p.Limit) + "/" + p.Period.String(), limit: p.Limit, period: p.Period.String()}
	case nil:
		return limits{}
	}
	algorithm, _, _ := strings.Cut(p.String(), ":")
	return limits{algorithm: algorithm}
}

func windowLimits(algorithm string, limit int, window time.Duration) limits {
	return limits{algorithm: algorithm, rate: rateText(limit, window), perSecond: perSecond(limit, window), limit: limit, window: window}
}

// concurrencyLimits returns a concurrency cap's numbers.
func concurrencyLimits(p throttle.Concurrency) limits {
	return limits{algorithm: "conc", limit: p.Limit, lease: p.Lease}
}

// rateText writes n per period as the library's short forms do: "10/1s",
// "25/1m", "3/1h30m".
func rateText(n int, per time.Duration) string { return strconv.Itoa(n) + "/" + shortSpan(per) }

// shortSpan writes d as time.Duration does, without the zero minutes and
// seconds that end whole hours and minutes: "1m", "1h", "1h30m".
func shortSpan(d time.Duration) string {
	s := d.String()
	if t, ok := strings.CutSuffix(s, "m0s"); ok {
		s = t + "m"
	}
	if t, ok := strings.CutSuffix(s, "h0m"); ok {
		s = t + "h"
	}
	return s
}

func perSecond(n int, per time.Duration) float64 {
	if per <= 0 {
		return 0
	}
	return float64(n) / per.Seconds()
}

// columns returns the two columns peek shows for the policy: RATE and
// BURST for a GCRA or TokenBucket, RATE and CAPACITY for a LeakyBucket,
// LIMIT and WINDOW for a window policy, LIMIT and PERIOD for a quota.
func (l limits) columns() (headers, cells [2]string) {
	switch l.algorithm {
	case "gcra", "tb":
		return [2]string{"RATE", "BURST"}, [2]string{l.rate, strconv.Itoa(l.burst)}
	case "lb":
		return [2]string{"RATE", "CAPACITY"}, [2]string{l.rate, strconv.Itoa(l.capacity)}
	case "fw", "sl", "sw":
		return [2]string{"LIMIT", "WINDOW"}, [2]string{strconv.Itoa(l.limit), shortSpan(l.window)}
	case "quota":
		return [2]string{"LIMIT", "PERIOD"}, [2]string{strconv.Itoa(l.limit), l.period}
	}
	return [2]string{"RATE", "BURST"}, [2]string{"-", "-"}
}

// rateCell and burstCell are top's RATE and BURST columns, for keys of
// every kind in one table: a window's or a quota's limit per window or
// period is its rate and it has no burst apart; a LeakyBucket's burst is
// its capacity; a concurrency cap has neither.
func (l limits) rateCell() string { return cmp.Or(l.rate, "-") }

func (l limits) burstCell() string {
	switch {
	case l.burst > 0:
		return strconv.Itoa(l.burst)
	case l.capacity > 0:
		return strconv.Itoa(l.capacity)
	}
	return "-"
}

// describe says the numbers in words, for reset's line: "rate 10/1s,
// burst 5".
func (l limits) describe() string {
	switch l.algorithm {
	case "gcra", "tb":
		return "rate " + l.rate + ", burst " + strconv.Itoa(l.burst)
	case "lb":
		return "rate " + l.rate + ", capacity " + strconv.Itoa(l.capacity)
	case "fw", "sl", "sw":
		return "limit " + strconv.Itoa(l.limit) + " per " + shortSpan(l.window) + " window"
	case "quota":
		return "limit " + strconv.Itoa(l.limit) + " per " + l.period
	case "conc":
		return strconv.Itoa(l.limit) + " slots, lease " + l.lease.String()
	}
	return ""
}
