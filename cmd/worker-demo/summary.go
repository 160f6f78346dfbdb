package main

import (
	"fmt"
	"io"
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

// summarize checks the run: every task ran exactly once, no second at the
// partner above what the policy allows, the export cap held, and asynq saw
// nothing fail or archived.
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
	algo := d.opts.algorithm.name
	allows, why := d.opts.algorithm.allows(d.opts.tenantRate)
	s.note("Highest rate at the partner (%s allows %s):", algo, why)
	for _, t := range tenantNames() {
		most := mostInAnySecond(d.partner.arrivals(t))
		s.check(most <= allows, "%-15s %2d calls in one second; %s %d/s allows %d",
			"tenant "+t, most, algo, d.opts.tenantRate, allows)
	}
	allAllows, _ := d.opts.algorithm.allows(d.opts.overallRate)
	most := mostInAnySecond(d.partner.arrivals(""))
	s.check(most <= allAllows, "%-15s %2d calls in one second; %d/s allows %d", "overall", most, d.opts.overallRate, allAllows)
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

// newcomerWithin is how soon after the tasks went in each tenant's first
// call must reach the partner, however much another enqueued before it.
const newcomerWithin = 2 * time.Second

// checkFairness checks, for rate rules, that while every tenant had calls
// left (from the last tenant's first call to the first tenant's last), each
// got its fair share of the overall limit, min(tenant rate, overall rate /
// tenants), within fairWithin, and that no tenant's first call waited
// behind another's backlog. d.mu is held.
func (d *demo) checkFairness(s *summary) {
	if !d.opts.algorithm.meter {
		s.note("fair shares: not checked (%s rules count calls in windows; only gcra and token-bucket share a limit fairly)", d.opts.algorithm.name)
		return
	}
	var start, end time.Time
	s.note("First call after the tasks went in, behind no other tenant's backlog:")
	for _, t := range tenantNames() {
		calls := d.partner.arrivals(t)
		if len(calls) == 0 {
			s.check(false, "fair shares: tenant %s made no call", t)
			return
		}
		first := calls[0].Sub(d.enqueued)
		s.check(first <= newcomerWithin, "%-15s %5s; within %s", "tenant "+t, first.Round(time.Millisecond), newcomerWithin)
		start = later(start, calls[0])
		if last := calls[len(calls)-1]; end.IsZero() || last.Before(end) {
			end = last
		}
	}
	span := end.Sub(start)
	if span < 2*time.Second {
		s.note("fair shares: not checked (every tenant had calls left for only %s; give more --tasks)", span.Round(time.Millisecond))
		return
	}
	n := len(tenantNames())
	fair := min(float64(d.opts.tenantRate), float64(d.opts.overallRate)/float64(n))
	total := 0.0
	s.note("Rate while every tenant had calls left (%s), and its fair share:", span.Round(time.Millisecond))
	for _, t := range tenantNames() {
		got := 0
		for _, at := range d.partner.arrivals(t) {
			if !at.Before(start) && at.Before(end) {
				got++
			}
		}
		rate := float64(got) / span.Seconds()
		total += rate
		s.check(rate >= fair*(1-fairWithin) && rate <= fair*(1+fairWithin), "%-15s %4.1f calls/s; its fair share %.1f/s ± %.0f%%",
			"tenant "+t, rate, fair, fairWithin*100)
	}
	s.note("%-15s %4.1f calls/s meanwhile, of %d/s", "overall", total, d.opts.overallRate)
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

// later returns the later of a and b; b when a is zero.
func later(a, b time.Time) time.Time {
	if a.IsZero() || b.After(a) {
		return b
	}
	return a
}
