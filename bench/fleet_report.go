package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
)

// serverSnap is what Redis has done so far: commands processed (each
// command inside a script counts, as Redis counts them), CPU seconds, and
// microseconds spent running scripts (EVALSHA, asynq's and the library's).
type serverSnap struct {
	at     time.Time
	cmds   int64
	cpu    float64
	script int64
}

// rates is what Redis did over a span: commands, CPU seconds and
// microseconds in scripts, and the span.
type rates struct {
	cmds    int64
	cpu     float64
	script  int64
	elapsed time.Duration
}

func (r rates) cmdsPerSec() float64 { return float64(r.cmds) / r.elapsed.Seconds() }
func (r rates) cpuPerSec() float64  { return r.cpu / r.elapsed.Seconds() }

func (r rates) scriptPerSec() float64 { return float64(r.script) / r.elapsed.Seconds() }

func (s serverSnap) since(from serverSnap) rates {
	return rates{cmds: s.cmds - from.cmds, cpu: s.cpu - from.cpu, script: s.script - from.script, elapsed: s.at.Sub(from.at)}
}

// plus adds two spans up.
func (r rates) plus(o rates) rates {
	return rates{cmds: r.cmds + o.cmds, cpu: r.cpu + o.cpu, script: r.script + o.script, elapsed: r.elapsed + o.elapsed}
}

// snap reads Redis's counters from INFO.
func snap(ctx context.Context, rdb *redis.Client) (serverSnap, error) {
	info, err := rdb.Info(ctx, "stats", "cpu", "commandstats").Result()
	if err != nil {
		return serverSnap{}, err
	}
	s := serverSnap{at: time.Now(), script: scriptTotalsOf(info).usec}
	for _, line := range strings.Split(info, "\n") {
		name, value, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch name {
		case "total_commands_processed":
			s.cmds, _ = strconv.ParseInt(value, 10, 64)
		case "used_cpu_sys", "used_cpu_user":
			v, _ := strconv.ParseFloat(value, 64)
			s.cpu += v
		}
	}
	return s, nil
}

// watch returns what Redis did over d.
func watch(ctx context.Context, rdb *redis.Client, d time.Duration) (rates, error) {
	from, err := snap(ctx, rdb)
	if err != nil {
		return rates{}, err
	}
	time.Sleep(d)
	to, err := snap(ctx, rdb)
	if err != nil {
		return rates{}, err
	}
	return to.since(from), nil
}

// fleetRow is one line of a scenario's table.
type fleetRow struct {
	n                   int
	plain               bool
	tasks               int
	perKeyRate, overall float64 // tasks/s
	mostPerKey, mostAll int     // starts in any 1 s
	trips               float64 // library round trips per task
	pings               float64 // of them, PINGs
	registry            float64 // of them, the registry's writes
	back                float64 // tasks sent back to asynq, per task
	// tripsAtOnce is the round trips of a task never sent back; tripsBack
	// those of a task sent back, its own and the fleet's round trips made
	// for no task (the return lane's turns, a waiting room's releases, but
	// the registry's writes) shared among such tasks (NaN without them).
	tripsAtOnce, tripsBack float64
	cmdsPerTask, cpuTask   float64 // idle rate taken out; CPU in µs
	// scriptTask is the µs Redis spent running scripts a task (asynq's and
	// the library's, the commands they run included), idle rate taken
	// out: the fleet at rest runs few, so this is far steadier than
	// cpuTask, which loses most of itself to the fleet's rate at rest at
	// 24 processes.
	scriptTask float64
	// restShare is the part of Redis's CPU over the run that is the
	// fleet's rate at rest, taken out of cpuTask: where it is most of the
	// run's CPU, cpuTask moves with any error in that rate.
	restShare float64
}

func (r fleetResult) row(sc scenario, n int, plain bool) fleetRow {
	row := fleetRow{n: n, plain: plain, tasks: r.tasks, trips: float64(r.trips) / float64(r.tasks), pings: float64(r.pings) / float64(r.tasks),
		registry: float64(r.registry) / float64(r.tasks),
		back:     float64(r.back) / float64(r.tasks)}
	var own, ownBack, atOnce, sent int64
	for id, n := range r.byTask {
		own += n
		if r.sentBack[id] {
			ownBack, sent = ownBack+n, sent+1
		}
	}
	atOnce = int64(r.tasks) - sent
	row.tripsAtOnce, row.tripsBack = math.NaN(), math.NaN()
	if atOnce > 0 {
		row.tripsAtOnce = float64(own-ownBack) / float64(atOnce)
	}
	if sent > 0 {
		row.tripsBack = float64(ownBack+r.trips-r.registry-own) / float64(sent)
	}
	// Rates are each batch's, averaged over the batches; the most starts in
	// 1 s, the most in any batch.
	for _, batch := range r.batches {
		all := make([]time.Time, len(batch))
		byKey := map[string][]time.Time{}
		for i, s := range batch {
			all[i] = s.at
			byKey[s.tenant] = append(byKey[s.tenant], s.at)
		}
		overall, most := achieved(all)
		row.overall += overall / float64(len(r.batches))
		row.mostAll = max(row.mostAll, most)
		var sum float64
		for _, starts := range byKey {
			rate, most := achieved(starts)
			sum += rate
			row.mostPerKey = max(row.mostPerKey, most)
		}
		row.perKeyRate += sum / float64(max(1, len(byKey))) / float64(len(r.batches))
	}
	// What the fleet at rest would have done over the run: its rate, the
	// mean of the spans before and after the tasks (which differ by up to
	// a tenth from one span to the next), over the run's length.
	atRest := func(rate func(rates) float64) float64 {
		return (rate(r.idle) + rate(r.idleAfter)) / 2 * r.run.elapsed.Seconds()
	}
	idleCPU := atRest(rates.cpuPerSec)
	row.cmdsPerTask = (float64(r.run.cmds) - atRest(rates.cmdsPerSec)) / float64(r.tasks)
	row.cpuTask = (r.run.cpu - idleCPU) / float64(r.tasks) * 1e6
	if r.run.cpu > 0 {
		row.restShare = idleCPU / r.run.cpu
	}
	row.scriptTask = (float64(r.run.script) - atRest(rates.scriptPerSec)) / float64(r.tasks)
	return row
}

// achieved returns the rate of starts from the first to the last, and the
// most starts in any 1 s.
func achieved(starts []time.Time) (float64, int) {
	if len(starts) < 2 {
		return 0, len(starts)
	}
	slices.SortFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
	span := starts[len(starts)-1].Sub(starts[0]).Seconds()
	most := 0
	for i, j := 0, 0; j < len(starts); j++ {
		for starts[j].Sub(starts[i]) >= time.Second {
			i++
		}
		most = max(most, j-i+1)
	}
	return float64(len(starts)-1) / span, most
}

// idleRow is what one fleet cost Redis at rest, per process.
type idleRow struct {
	scenario  string
	n         int
	plain     bool
	cmds      float64 // per second
	cpu       float64 // µs per second
	cmdsAfter float64 // per second, at rest again after the tasks
	cpuAfter  float64 // µs per second, at rest again after the tasks
}

func (r fleetResult) atRest(n int, plain bool, scenario string) idleRow {
	return idleRow{
		scenario: scenario, n: n, plain: plain,
		cmds:      (r.idle.cmdsPerSec() - r.base.cmdsPerSec()) / float64(n),
		cpu:       (r.idle.cpuPerSec() - r.base.cpuPerSec()) / float64(n) * 1e6,
		cmdsAfter: (r.idleAfter.cmdsPerSec() - r.base.cmdsPerSec()) / float64(n),
		cpuAfter:  (r.idleAfter.cpuPerSec() - r.base.cpuPerSec()) / float64(n) * 1e6,
	}
}

func printFleetRows(w io.Writer, sc scenario, rows []fleetRow) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	allowed := func(n int) string {
		if n == 0 {
			return ""
		}
		return fmt.Sprintf(" (≤%d)", n)
	}
	fmt.Fprintf(tw, "N\tfleet\ttasks\tper key/s\toverall/s\tmost in 1 s, a key\tmost in 1 s, all\tlibrary trips/task\tof them PINGs\tof them the registry's\twent back/task\ttrips, task not sent back\ttrips, task sent back\tRedis cmds/task\tRedis CPU µs/task\tof the run's CPU, at rest\tµs in scripts/task\t\n")
	two := func(v float64) string {
		if math.IsNaN(v) {
			return "—"
		}
		return fmt.Sprintf("%.2f", v)
	}
	for _, r := range rows {
		who, trips, pings, reg, back, once, sent := "library", two(r.trips), two(r.pings), two(r.registry), two(r.back), two(r.tripsAtOnce), two(r.tripsBack)
		if r.plain {
			who, trips, pings, reg, back, once, sent = "plain asynq", "—", "—", "—", "—", "—", "—"
			if r.back > 0 {
				who, back = "plain asynq, back once", two(r.back)
			}
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%.1f\t%.1f\t%d%s\t%d%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.0f\t%.0f\t%.0f%%\t%.0f\t\n",
			r.n, who, r.tasks, r.perKeyRate, r.overall, r.mostPerKey, allowed(sc.perKey), r.mostAll, allowed(sc.overall), trips, pings, reg, back, once, sent, r.cmdsPerTask, r.cpuTask, 100*r.restShare, r.scriptTask)
	}
	_ = tw.Flush()
}

func printIdleRows(w io.Writer, rows []idleRow) {
	fmt.Fprintln(w, "at rest, per worker process (Redis with no worker process taken out):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "scenario\tN\tfleet\tRedis cmds/s\tRedis CPU µs/s\tafter the tasks: cmds/s\tCPU µs/s\t\n")
	for _, r := range rows {
		who := "library"
		if r.plain {
			who = "plain asynq"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%.1f\t%.0f\t%.1f\t%.0f\t\n", r.scenario, r.n, who, r.cmds, r.cpu, r.cmdsAfter, r.cpuAfter)
	}
	_ = tw.Flush()
}
