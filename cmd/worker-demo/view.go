package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// view draws the run: on a terminal a live table redrawn in place each
// second, with a bar and a sparkline per tenant; otherwise one plain line a
// second.
type view struct {
	out   io.Writer
	opts  options
	d     *demo
	live  bool
	lines int              // lines drawn by the last live frame
	rates map[string][]int // per-second partner calls, per tenant ("" for all)
}

func newView(out io.Writer, opts options, d *demo) *view {
	live := false
	if f, ok := out.(*os.File); ok && !opts.plain {
		if info, err := f.Stat(); err == nil && info.Mode()&os.ModeCharDevice != 0 {
			live = true
		}
	}
	return &view{out: out, opts: opts, d: d, live: live, rates: map[string][]int{}}
}

// frame draws the state now.
func (v *view) frame() {
	now := time.Now()
	elapsed := now.Sub(v.d.started).Truncate(time.Second)
	for _, t := range append(tenantNames(), "") {
		v.rates[t] = append(v.rates[t], inLastSecond(v.d.partner.arrivals(t), now))
	}
	d := v.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if !v.live {
		done, total := 0, 0
		for _, t := range tenantNames() {
			done += d.ranBy[t]
			total += d.expected[t]
		}
		fmt.Fprintf(v.out, "%4ds  partner calls %d/%d (last second %d, limit %d/s)  exports %d/%d  waited inline %d  rescheduled %d\n",
			int(elapsed.Seconds()), done, total, last(v.rates[""]), v.opts.overallRate,
			d.ranBy["exports"], v.opts.exports, sum(d.waited), sum(d.resched))
		return
	}
	var b strings.Builder
	if v.lines > 0 {
		fmt.Fprintf(&b, "\033[%dA", v.lines) // back to the top of the last frame
	}
	line := func(format string, args ...any) {
		fmt.Fprintf(&b, "\033[K"+format+"\n", args...)
	}
	line("jobthrottle worker demo · %s · %d/s per tenant, %d/s overall · exports %d at once", v.opts.algorithm.name, v.opts.tenantRate, v.opts.overallRate, v.opts.exportCap)
	line("%d asynq servers × %d workers · %s · %s of at most %s", v.opts.servers, v.opts.concurrency, redisName(v.opts), elapsed, v.opts.duration)
	line("")
	line("%-9s %-22s %9s %8s %8s %8s  %-20s %s", "tenant", "done", "", "waiting", "inline", "resched", "calls per second", "now / limit")
	for _, t := range tenantNames() {
		done, total := d.ranBy[t], d.expected[t]
		line("%-9s %s %9s %8d %8d %8d  %-20s %2d / %d", t, bar(done, total, 22), fmt.Sprintf("%d/%d", done, total),
			total-done, d.waited[t], d.resched[t], spark(v.rates[t], v.opts.tenantRate), last(v.rates[t]), v.opts.tenantRate)
	}
	line("%-9s %-22s %9s %8s %8s %8s  %-20s %2d / %d", "overall", "", "", "", "", "", spark(v.rates[""], v.opts.overallRate), last(v.rates[""]), v.opts.overallRate)
	line("%-9s %s %9s   running %d (cap %d)", "exports", bar(d.ranBy["exports"], v.opts.exports, 22), fmt.Sprintf("%d/%d", d.ranBy["exports"], v.opts.exports), d.exports.Load(), v.opts.exportCap)
	v.lines = strings.Count(b.String(), "\n")
	_, _ = io.WriteString(v.out, b.String())
}

func tenantNames() []string {
	var names []string
	for _, t := range tenants {
		names = append(names, t.name)
	}
	return names
}

func redisName(o options) string {
	if o.redisAddr == "" {
		return "embedded Redis"
	}
	return "Redis at " + o.redisAddr
}

// bar draws done of total in width cells.
func bar(done, total, width int) string {
	filled := width
	if total > 0 {
		filled = done * width / total
	}
	return strings.Repeat("█", filled) + strings.Repeat("░", width-filled)
}

// spark draws the last 20 per-second counts against limit.
func spark(counts []int, limit int) string {
	const levels = "▁▂▃▄▅▆▇█"
	glyphs := []rune(levels)
	if len(counts) > 20 {
		counts = counts[len(counts)-20:]
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
