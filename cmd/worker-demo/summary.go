package main

import (
	"fmt"
	"io"
	"math"
	"strings"
	"time"
)

// summary is what the run proves, and whether the policy held.
type summary struct {
	lines []string
	held  bool
}

func (s *summary) check(ok bool, format string, args ...any) {
	mark := "ok  "
	if !ok {
		mark = "FAIL"
		s.held = false
	}
	s.lines = append(s.lines, mark+"  "+fmt.Sprintf(format, args...))
}

// note adds a line that checks nothing: a heading or a figure.
func (s *summary) note(format string, args ...any) {
	s.lines = append(s.lines, summaryIndent+fmt.Sprintf(format, args...))
}

// summaryWidth is the most runes a line of the summary takes; a longer
// line is wrapped, its rest indented under its text.
const (
	summaryWidth  = defaultWidth
	summaryIndent = "      " // the width of "ok    " and "FAIL  "
)

// summarize checks the run: every task ran exactly once, no second above
// what the policy allows (see checkRates), the export cap held, and asynq
// saw nothing fail or archived.
func (d *demo) summarize() summary {
	s := summary{held: true}
	took := time.Since(d.started).Round(100 * time.Millisecond)
	d.mu.Lock()
	twice, total := 0, 0
	for _, n := range d.runs {
		total++
		if n > 1 {
			twice++
		}
	}
	want := d.opts.tasks + d.opts.batch + d.opts.exports
	s.check(total == want && twice == 0, "every task processed exactly once: %d of %d ran, %d more than once", total, want, twice)
	d.checkRates(&s)
	d.checkFairness(&s)
	s.check(int(d.mostExp.Load()) <= d.opts.exportCap, "exports at once: at most %d, cap %d", d.mostExp.Load(), d.opts.exportCap)
	throttled := fmt.Sprintf("throttled tasks: %d waited inline, %d rescheduled, %d given up", sum(d.waited), sum(d.resched), d.gaveUp)
	d.mu.Unlock()
	info, err := d.inspector.GetQueueInfo(d.queue)
	if err != nil {
		s.check(false, "asynq queue info: %v", err)
	} else {
		s.check(info.Failed == 0 && info.Archived == 0, "asynq: %d failed, %d archived", info.Failed, info.Archived)
	}
	s.note("%s", throttled)
	s.note("run took %s", took)
	if s.held {
		s.lines = append(s.lines, "The fleet held the policy.")
	} else {
		s.lines = append(s.lines, "The fleet did NOT hold the policy.")
	}
	return s
}

// fairWithin is how far from its fair share a tenant's rate may be while
// every tenant has a backlog.
const fairWithin = 0.20

// newcomerAhead is the most of the calls enqueued before a tenant's first
// that may run before it: a tenant behind the others' backlog would wait
// for all of them. How many do run before it depends on the machine: the
// fleet takes each call ahead from the queue and throttles it (it waits or
// goes back) before it reaches the tenant's first, which takes longer on a
// slower or busier machine, while the calls admitted meanwhile come at the
// limits' rate. Measured with TestDemoHoldsThePolicy when it ran 120 calls
// (72 calls ahead of globex's first, 96 ahead of initech's) while two
// other processes kept both cores of a 2-core machine busy: 6-17 and 10-25 ran first (five
// runs, alone and in the whole suite), 15-19 and 26-28 under the race
// detector (three runs): at most 29%. In CI's pass against the Cluster,
// under the race detector beside the pass against redis-server, 42 of 96
// and 65 of 128 ran first (2026-12-03; the same code before and after the
// day's change gave 17-38 of 144 under -race on a busy machine): at most
// 51%, so the bound is 75%, well below the 100% of a tenant behind the
// backlog.
const newcomerAhead = 0.75

// checkRates checks the most partner calls in any second, per tenant and
// in all, against what the policy allows. For rate rules (GCRA and
// TokenBucket) it checks them strictly where the limits decide, on the
// admissions (the worker reports each task's slot on the Redis clock, one
// instant for all its rules), and checks each call's arrival at the
// partner after its admission (checkArrivals). Window rules admit a task
// rule after rule, at instants the worker does not report: their calls are
// counted at the partner, on this process's clock, in any second less
// arrivalWithin, the most a call may take from its admission to the
// partner. d.mu is held.
func (d *demo) checkRates(s *summary) {
	algo := d.opts.algorithm
	allows, why := algo.allows(d.opts.tenantRate)
	allAllows, _ := algo.allows(d.opts.overallRate)
	if !algo.meter {
		w := time.Second - arrivalWithin
		s.note("Most calls at the partner in any %s, a second less the %s a call may take to get there (%s allows %s):", w, arrivalWithin, algo.name, why)
		for _, t := range tenantNames() {
			most := mostInAny(d.partner.arrivals(t), w)
			s.check(most <= allows, "%-15s %2d calls; %s %d/s allows %d", "tenant "+t, most, algo.name, d.opts.tenantRate, allows)
		}
		most := mostInAny(d.partner.arrivals(""), w)
		s.check(most <= allAllows, "%-15s %2d calls; %d/s allows %d", "overall", most, d.opts.overallRate, allAllows)
		return
	}
	s.note("Most partner calls admitted in any second, on Redis's clock (%s allows %s):", algo.name, why)
	for _, t := range tenantNames() {
		most := mostInAny(d.admissionsLocked(t), time.Second)
		s.check(most <= allows, "%-15s %2d admitted; %s %d/s allows %d", "tenant "+t, most, algo.name, d.opts.tenantRate, allows)
	}
	most := mostInAny(d.admissionsLocked(""), time.Second)
	s.check(most <= allAllows, "%-15s %2d admitted; %d/s allows %d", "overall", most, d.opts.overallRate, allAllows)
	d.checkArrivals(s)
}

// checkArrivals checks that every call reached the partner soon after its
// admission: no earlier than it (but for the uncertainty of the clocks'
// offset and a few milliseconds), no later than arrivalWithin. So no
// window of a second less arrivalWithin at the partner held more calls
// than the limits admitted in a second. d.mu is held.
func (d *demo) checkArrivals(s *summary) {
	arrivals := d.partner.arrivals("")
	least, most, ok := lateness(arrivals, d.admissionsLocked(""), d.offset)
	if !ok {
		s.check(false, "%d calls reached the partner, %d admitted", len(arrivals), len(d.admissionsLocked("")))
		return
	}
	early := d.offsetErr + 5*time.Millisecond
	s.check(least >= -early && most <= arrivalWithin, "calls reached the partner %s to %s after their admissions; within %s",
		least.Round(time.Millisecond), most.Round(time.Millisecond), arrivalWithin)
}

// checkFairness checks, for rate rules, on the Redis clock: that while
// every tenant had a call waiting for the throttle (see whileAllWaited),
// each got its fair share of what was admitted meanwhile, min(tenant rate,
// admitted rate / tenants), within fairWithin, and that no tenant's first
// call waited behind another's backlog: at most
// newcomerAhead of the calls enqueued before it ran before it. d.mu is
// held.
func (d *demo) checkFairness(s *summary) {
	if !d.opts.algorithm.meter {
		s.note("fair shares: not checked (%s rules count calls in windows; only gcra and token-bucket share a limit fairly)", d.opts.algorithm.name)
		return
	}
	all := d.admissionsLocked("")
	if len(all) == 0 {
		s.check(false, "fair shares: no call admitted")
		return
	}
	s.note("First admission, behind no other tenant's backlog:")
	queued := 0 // calls enqueued before the tenant's first
	for i, t := range tenantNames() {
		calls := d.admissionsLocked(t)
		if len(calls) == 0 {
			s.check(false, "fair shares: tenant %s made no call", t)
			return
		}
		ahead := 0 // of those, admitted before the tenant's first
		for _, before := range tenantNames()[:i] {
			for _, at := range d.admissionsLocked(before) {
				if at.Before(calls[0]) {
					ahead++
				}
			}
		}
		s.check(float64(ahead) <= newcomerAhead*float64(queued), "%-15s %5s after the first; %d of %d ahead ran first",
			"tenant "+t, calls[0].Sub(all[0]).Round(time.Millisecond), ahead, queued)
		for j := range d.opts.tasks {
			if tenantOf(j, d.opts.tasks) == t {
				queued++
			}
		}
	}
	// Fair sharing is between tenants whose calls wait: a tenant whose
	// calls are still on their way to a worker (behind the others' in
	// asynq's queue, on a busy machine) cannot take its share. So the
	// rates are measured while every tenant had a call waiting.
	seen := map[string][]time.Time{}
	for t, ats := range d.firstSeen {
		for _, at := range ats {
			seen[t] = append(seen[t], at.Add(d.offset))
		}
	}
	span, got := whileAllWaited(tenantNames(), seen, d.admitted)
	if span < 2*time.Second {
		s.note("fair shares: not checked (every tenant had calls waiting for only %s; give more --tasks)", span.Round(time.Millisecond))
		return
	}
	// The fair share is of what the fleet admitted meanwhile: on a machine
	// too busy to keep the fleet at the overall limit, every tenant still
	// gets an equal part of what it does admit (measured under CI's load:
	// 3.2-3.3/s each of 9.7/s in all, where a share of the limit, 6.7/s,
	// would have failed a fair fleet).
	n := len(tenantNames())
	rates := map[string]float64{}
	total := 0.0
	for _, t := range tenantNames() {
		rates[t] = float64(got[t]) / span.Seconds()
		total += rates[t]
	}
	fair := min(float64(d.opts.tenantRate), total/float64(n))
	s.note("Rate while every tenant had calls waiting (%s), and its fair share of the %.1f calls/s admitted meanwhile (the limit: %d/s):",
		span.Round(time.Millisecond), total, d.opts.overallRate)
	// The span starts and ends between admissions of a round of the
	// tenants' turns, so each tenant's count in it can be one call off at
	// either end: over a span of 3 s, 2 calls are 0.7 calls/s, which
	// fairWithin alone would have counted against a fair fleet (CI's pass
	// against the Cluster, 2026-12-03: 19, 24 and 17 calls in 2.97 s).
	edges := 2 / span.Seconds()
	for _, t := range tenantNames() {
		rate := rates[t]
		s.check(math.Abs(rate-fair) <= fair*fairWithin+edges, "%-15s %4.1f calls/s; its fair share %.1f/s ± %.0f%% ± 2 calls",
			"tenant "+t, rate, fair, fairWithin*100)
	}
}

// write prints the summary, each line wrapped to summaryWidth; with color,
// its ok and FAIL marks in green and red.
func (s summary) write(out io.Writer, color bool) {
	var lines []string
	for _, line := range s.lines {
		wrapped := wrap(line, summaryWidth, summaryIndent)
		switch {
		case strings.HasPrefix(line, "ok  "):
			wrapped[0] = paint(color, green, "ok") + wrapped[0][2:]
		case strings.HasPrefix(line, "FAIL"):
			wrapped[0] = paint(color, red, "FAIL") + wrapped[0][4:]
		}
		lines = append(lines, wrapped...)
	}
	fmt.Fprintf(out, "\nSummary\n%s\n", strings.Join(lines, "\n"))
}
