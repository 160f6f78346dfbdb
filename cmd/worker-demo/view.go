package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// view draws the run: on a terminal a live table redrawn in place each
// second, with a bar and a sparkline per tenant, fitted to the terminal's
// width; otherwise one plain line a second.
type view struct {
	out   io.Writer
	opts  options
	term  terminal
	lines int              // lines drawn by the last live frame
	rates map[string][]int // per-second partner calls, per tenant ("" for all)
}

func newView(out io.Writer, opts options, term terminal) *view {
	return &view{out: out, opts: opts, term: term, rates: map[string][]int{}}
}

// snapshot is the run's state at one frame.
type snapshot struct {
	elapsed   time.Duration
	redis     string         // where the Redis is, as the header says it
	done      map[string]int // tenant (or "exports") → tasks done
	expected  map[string]int // tenant → tasks calling the partner
	waited    map[string]int // tenant → tasks that waited inline
	resched   map[string]int // tenant → reschedules
	exporting int            // exports running now
	lastCalls map[string]int // tenant ("" for all) → partner calls in the last second
}

// frame draws s.
func (v *view) frame(s snapshot) {
	for _, t := range append(tenantNames(), "") {
		v.rates[t] = append(v.rates[t], s.lastCalls[t])
	}
	if !v.term.live {
		line := v.progress(s)
		if v.term.tty {
			line = fit(line, v.term.width()) // a dumb terminal's
		} else {
			line = strings.Join(wrap(line, defaultWidth, "      "), "\n") // a log keeps it whole
		}
		_, _ = io.WriteString(v.out, line+"\n")
		return
	}
	var b strings.Builder
	if v.lines > 0 {
		b.WriteString(cursorUp(v.lines)) // back to the top of the last frame
	}
	lines := v.table(s, v.term.width())
	for _, line := range lines {
		b.WriteString(clearLine + line + "\n")
	}
	v.lines = len(lines)
	_, _ = io.WriteString(v.out, b.String())
}

// progress is the plain line of a frame, for a pipe or a dumb terminal. It
// fits defaultWidth while the run is under 1000s and its counts under a
// million; frame wraps a longer one in a log.
func (v *view) progress(s snapshot) string {
	done, total := 0, 0
	for _, t := range tenantNames() {
		done += s.done[t]
		total += s.expected[t]
	}
	return fmt.Sprintf("%3ds  calls %d/%d  %d/s of %d/s  exports %d/%d  waited %d  resched %d",
		int(s.elapsed.Seconds()), done, total, last(v.rates[""]), v.opts.overallRate,
		s.done["exports"], v.opts.exports, sum(s.waited), sum(s.resched))
}

// The table's columns: name, bar, done, inline, resched, sparkline, rate.
// Only the bar and the sparkline stretch.
const (
	nameWidth = 8
	doneWidth = 9 // "1200/1200"
	rateWidth = 9 // "now/limit"
	fixedCols = nameWidth + 1 + 1 + doneWidth + 1 + 6 + 1 + 7 + 2 + 1 + rateWidth
	maxBar    = 22
	maxSpark  = 20
)

// table returns the live frame's lines, each at most width columns.
func (v *view) table(s snapshot, width int) []string {
	color := v.term.color
	stretch := max(width-fixedCols, 8)
	sparkWidth := min(stretch/2, maxSpark)
	barWidth := min(stretch-sparkWidth, maxBar)
	row := func(name, bar, done, inline, resched, spark, rate string) string {
		return fmt.Sprintf("%-*s %s %*s %6s %7s  %s %*s", nameWidth, name, bar, doneWidth, done, inline, resched, spark, rateWidth, rate)
	}
	pad := func(s string, n int) string { return s + strings.Repeat(" ", max(n-visibleWidth(s), 0)) }
	lines := []string{
		fmt.Sprintf("%s · %s · %d/s per tenant, %d/s overall · %d exports at once",
			paint(color, bold, "worker demo"), v.opts.algorithm.name, v.opts.tenantRate, v.opts.overallRate, v.opts.exportCap),
		fmt.Sprintf("%d servers × %d workers · %s · %s of %s", v.opts.servers, v.opts.concurrency, s.redis, s.elapsed.Truncate(time.Second), v.opts.duration),
		"",
		row("tenant", pad("done", barWidth), "", "inline", "resched", pad(sparkTitle(sparkWidth), sparkWidth), "now/limit"),
	}
	for _, t := range tenantNames() {
		done, total := s.done[t], s.expected[t]
		now := last(v.rates[t])
		rate := fmt.Sprintf("%d/%d", now, v.opts.tenantRate)
		if allows, _ := v.opts.algorithm.allows(v.opts.tenantRate); now > allows {
			rate = paint(color, red, rate)
		}
		lines = append(lines, row(t, bar(done, total, barWidth, color), fmt.Sprintf("%d/%d", done, total),
			fmt.Sprint(s.waited[t]), fmt.Sprint(s.resched[t]), pad(spark(v.rates[t], v.opts.tenantRate, sparkWidth), sparkWidth), rate))
	}
	lines = append(lines,
		row("overall", pad("", barWidth), "", "", "", pad(spark(v.rates[""], v.opts.overallRate, sparkWidth), sparkWidth),
			fmt.Sprintf("%d/%d", last(v.rates[""]), v.opts.overallRate)),
		fmt.Sprintf("%-*s %s %*s  running %d, cap %d", nameWidth, "exports", bar(s.done["exports"], v.opts.exports, barWidth, color),
			doneWidth, fmt.Sprintf("%d/%d", s.done["exports"], v.opts.exports), s.exporting, v.opts.exportCap))
	for i, line := range lines {
		lines[i] = fit(strings.TrimRight(line, " "), width)
	}
	return lines
}

// sparkTitle heads the sparklines' column.
func sparkTitle(width int) string {
	if width < len("calls per second") {
		return "calls/s"
	}
	return "calls per second"
}

// snapshot reads the run's state now.
func (d *demo) snapshot() snapshot {
	now := time.Now()
	s := snapshot{elapsed: now.Sub(d.started), redis: d.redisName(), lastCalls: map[string]int{}}
	for _, t := range append(tenantNames(), "") {
		s.lastCalls[t] = inLastSecond(d.partner.arrivals(t), now)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	s.done, s.expected, s.waited, s.resched = clone(d.ranBy), clone(d.expected), clone(d.waited), clone(d.resched)
	s.exporting = int(d.exports.Load())
	return s
}

func clone(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func tenantNames() []string {
	var names []string
	for _, t := range tenants {
		names = append(names, t.name)
	}
	return names
}

// bar draws done of total in width cells, the done part green when color.
func bar(done, total, width int, color bool) string {
	filled := width
	if total > 0 {
		filled = min(done*width/total, width)
	}
	return paint(color, green, strings.Repeat("█", filled)) + strings.Repeat("░", width-filled)
}

// spark draws the last width per-second counts against limit.
func spark(counts []int, limit, width int) string {
	const levels = "▁▂▃▄▅▆▇█"
	glyphs := []rune(levels)
	if len(counts) > width {
		counts = counts[len(counts)-width:]
	}
	var b strings.Builder
	for _, c := range counts {
		i := c * (len(glyphs) - 1) / max(limit, 1)
		b.WriteRune(glyphs[min(max(i, 0), len(glyphs)-1)])
	}
	return b.String()
}

func last(xs []int) int {
	if len(xs) == 0 {
		return 0
	}
	return xs[len(xs)-1]
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
