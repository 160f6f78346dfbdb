package main

import (
	"context"
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
	s.check(total == want && twice == 0, "every task processed exactly once: %d of %d tasks ran, %d more than once", total, want, twice)
	allows, why := d.opts.algorithm.allows(d.opts.tenantRate)
	for _, t := range tenantNames() {
		most := mostInAnySecond(d.partner.arrivals(t))
		s.check(most <= allows, "tenant %-8s highest rate at the partner: %2d calls in one second; %s %d/s allows %d (%s)",
			t, most, d.opts.algorithm.name, d.opts.tenantRate, allows, why)
	}
	allAllows, _ := d.opts.algorithm.allows(d.opts.overallRate)
	most := mostInAnySecond(d.partner.arrivals(""))
	s.check(most <= allAllows, "overall        highest rate at the partner: %2d calls in one second; %d/s allows %d", most, d.opts.overallRate, allAllows)
	s.check(int(d.mostExp.Load()) <= d.opts.exportCap, "exports at once: at most %d, cap %d", d.mostExp.Load(), d.opts.exportCap)
	throttled := fmt.Sprintf("throttled tasks: %d waited inline, %d rescheduled, %d given up", sum(d.waited), sum(d.resched), d.gaveUp)
	d.mu.Unlock()
	info, err := d.inspector.GetQueueInfo(d.queue)
	if err != nil {
		s.check(false, "asynq queue info: %v", err)
	} else {
		s.check(info.Failed == 0 && info.Archived == 0, "asynq: %d failed, %d archived", info.Failed, info.Archived)
	}
	s.lines = append(s.lines, "      "+throttled, fmt.Sprintf("      run took %s", took))
	if s.held {
		s.lines = append(s.lines, "The fleet held the policy.")
	} else {
		s.lines = append(s.lines, "The fleet did NOT hold the policy.")
	}
	_ = context.Background
	return s
}

func (s summary) write(out io.Writer) {
	fmt.Fprintf(out, "\nSummary\n%s\n", strings.Join(s.lines, "\n"))
}
