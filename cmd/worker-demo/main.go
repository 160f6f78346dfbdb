// Command worker-demo runs jobthrottle's main job end to end: a small fleet
// of asynq servers in one process works off tasks of three tenants that call
// a fake partner API, held to a rate per tenant and overall by the worker
// middleware, with a nightly batch paced by the scheduler and a concurrency
// cap on exports. One tenant enqueues three times as much as each other,
// first; the overall limit is shared fairly between them. It shows the work
// live, then checks what it proves: every task processed exactly once, no
// second above the policy (for rate rules, of admissions on the Redis
// clock, where the limits decide, with every call at the partner within
// 400 ms of its admission; for window rules, of calls at the partner, in
// any second less those 400 ms), no tenant's first call behind another's
// backlog, each tenant's fair share while all have calls waiting, nothing
// failed or archived. It exits 0 when the run held the policy,
// 1 when it did not, 2 when it could not run, and 130 when interrupted.
//
// By default it starts an embedded Redis on a loopback port; --redis
// host:port uses a real one. Either way it first prints its key prefix and
// the throttlectl command that watches its limiters while it runs, and at
// the end, or on Ctrl-C, it deletes every key it created (found with SCAN):
// its limiters' and asynq's, counters and per-day stats included.
//
// With --dashboard host:port it serves the web dashboard (package
// dashboard) there while the fleet runs, fed by a dashboard.Publisher given
// to every limiter and to the worker, and prints its URL and the token its
// actions ask for; the run then lasts the whole --duration, after the work
// is done too (Ctrl-C ends it sooner), and the dashboard stops with it.
//
// On a terminal the view is redrawn in place, fitted to COLUMNS, else to
// the terminal's width (on Linux), else to 80 columns; NO_COLOR (any
// non-empty value) turns colour off. On TERM=dumb, with --plain, or when
// stdout is not a terminal it prints one plain progress line a second.
//
//	go run ./cmd/worker-demo
//	go run ./cmd/worker-demo --algorithm sliding-log --tasks 400
//	go run ./cmd/worker-demo --dashboard 127.0.0.1:8080
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// options are the demo's flags.
type options struct {
	duration    time.Duration
	tasks       int
	batch       int
	exports     int
	exportCap   int
	tenantRate  int
	overallRate int
	algorithm   algorithm
	servers     int
	concurrency int
	redisAddr   string
	cluster     bool   // redisAddr names seeds of a Redis Cluster
	sentinel    string // the master's name: redisAddr names its Sentinels
	plain       bool
	dashboard   string // host:port, or "" for none
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// exitInterrupted is the exit status of a run stopped by a signal.
const exitInterrupted = 130

// run is the whole demo: it returns the exit status. It stops early, and
// still removes its keys, when ctx is done.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) (code int) {
	opts, err := parseFlags(args, stderr)
	var parseErr flagError
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &parseErr):
		return 2 // the flag package has said what was wrong
	case err != nil:
		printWrapped(stderr, "worker-demo: "+err.Error())
		return 2
	}
	term := detectTerminal(stdout, opts.plain, getenv)
	d, err := startDemo(opts)
	if err != nil {
		printWrapped(stderr, "worker-demo: "+err.Error())
		return 2
	}
	defer func() {
		removed, err := d.stop()
		switch {
		case err != nil:
			printWrapped(stderr, "worker-demo: "+err.Error())
			code = max(code, 1)
		case d.mini == nil:
			printWrapped(stdout, fmt.Sprintf("Removed the demo's %d keys from the Redis at %s.", removed, d.addr))
		}
	}()
	d.introduce(stdout)
	view := newView(stdout, opts, term)
	deadline := time.Now().Add(opts.duration)
	ticker := time.NewTicker(time.Second)
	defer ticker.Stop()
	// The run ends when every task has run, or at --duration; with
	// --dashboard, only at --duration (or Ctrl-C), so that the dashboard
	// stays up to be looked at after the work is done.
	finished := d.finished
	for (!d.done() || d.dash != nil) && time.Now().Before(deadline) && ctx.Err() == nil {
		view.frame(d.snapshot())
		select {
		case <-ticker.C:
		case <-finished:
			finished = nil // closed: wait on the ticker from now on
		case <-ctx.Done():
		}
	}
	view.frame(d.snapshot())
	if ctx.Err() != nil {
		fmt.Fprintln(stderr, "worker-demo: interrupted; removing the demo's keys")
		return exitInterrupted
	}
	s := d.summarize()
	s.write(stdout, term.color)
	if !s.held {
		return 1
	}
	return 0
}

// introduce says where the demo keeps its keys and how to watch its
// limiters with throttlectl while it runs. Each line fits defaultWidth but
// the command, which has one of its own (so it can be copied whole) and
// fits too for a Redis on loopback.
func (d *demo) introduce(out io.Writer) {
	fmt.Fprintf(out, "Keys: prefix %s, asynq queue %s,\n", d.prefix, d.queue)
	printWrapped(out, fmt.Sprintf("on the %s.", d.redisName()))
	fmt.Fprintf(out, "Watch its limiters from another terminal (add --all for every key):\n  %s\n", d.watchCommand())
	if d.dash != nil {
		d.dash.introduce(out)
	}
	fmt.Fprintln(out)
}

// printWrapped prints s wrapped to defaultWidth, the lines after the first
// indented by two spaces.
func printWrapped(out io.Writer, s string) {
	fmt.Fprintln(out, strings.Join(wrap(s, defaultWidth, "  "), "\n"))
}

// watchCommand is the throttlectl command line that lists the demo's
// throttled keys, run from the module's root.
func (d *demo) watchCommand() string {
	topology := ""
	if d.spec.Cluster {
		topology = " --cluster"
	} else if d.spec.Master != "" {
		topology = " --sentinel " + d.spec.Master
	}
	return fmt.Sprintf("go run ./cmd/throttlectl --redis %s%s --prefix %s top", d.addr, topology, d.prefix)
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	var algo string
	fs := flag.NewFlagSet("worker-demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.DurationVar(&o.duration, "duration", 30*time.Second, "longest the run may take; the work left at -1 is sized to finish in about half of it")
	fs.IntVar(&o.tasks, "tasks", -1, "partner calls to enqueue at the start: 60% for acme first, then 20% each for globex and initech; -1: overall-rate × duration / 3")
	fs.IntVar(&o.batch, "batch", -1, "tasks of the nightly batch the scheduler paces for the third tenant; -1: tenant-rate × duration / 10")
	fs.IntVar(&o.exports, "exports", 8, "export tasks, each about 300 ms, under the concurrency cap")
	fs.IntVar(&o.exportCap, "export-cap", 2, "exports allowed to run at once across the fleet")
	fs.IntVar(&o.tenantRate, "tenant-rate", 10, "partner calls per second allowed per tenant")
	fs.IntVar(&o.overallRate, "overall-rate", 20, "partner calls per second allowed in all")
	fs.StringVar(&algo, "algorithm", "gcra", "rate limiting algorithm: "+algorithmNames())
	fs.IntVar(&o.servers, "servers", 3, "asynq servers in the fleet")
	fs.IntVar(&o.concurrency, "concurrency", 10, "workers per server")
	fs.StringVar(&o.redisAddr, "redis", "", "`address` of a Redis to use instead of the embedded one: host:port or a redis:// URL; with --cluster or --sentinel, comma-separated host:port or one URL with more as ?addr=host:port")
	fs.BoolVar(&o.cluster, "cluster", false, "--redis names seeds of a Redis Cluster")
	fs.StringVar(&o.sentinel, "sentinel", "", "the `master` name: --redis names Sentinels that know the master by it (a URL's password is the Sentinels', the master's is ?password=)")
	fs.StringVar(&o.dashboard, "dashboard", "", "`host:port` to serve the web dashboard on while the fleet runs, e.g. 127.0.0.1:8080; port 0 picks a free one. The run then lasts the whole --duration (Ctrl-C ends it sooner). Its actions take the token printed at the start")
	fs.BoolVar(&o.plain, "plain", false, "plain output even on a terminal (it is plain when stdout is not one)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: worker-demo [flags]\n\nRuns a fleet of asynq servers held to fleet-wide limits and checks they held.\n\nflags:")
		// The flag package puts each flag's text after "    \t", which a
		// terminal shows at column 8; wrap it to end by column 80.
		var defaults strings.Builder
		fs.SetOutput(&defaults)
		fs.PrintDefaults()
		fs.SetOutput(stderr)
		const textPrefix = "    \t"
		for _, line := range strings.Split(strings.TrimSuffix(defaults.String(), "\n"), "\n") {
			if text, ok := strings.CutPrefix(line, textPrefix); ok {
				for _, part := range wrap(text, defaultWidth-8, "") {
					fmt.Fprintln(stderr, textPrefix+part)
				}
				continue
			}
			fmt.Fprintln(stderr, line)
		}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return o, err
		}
		return o, flagError{err}
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if o.algorithm, err = lookupAlgorithm(algo); err != nil {
		return o, err
	}
	if o.duration <= 0 {
		return o, fmt.Errorf("--duration must be positive, got %s", o.duration)
	}
	if o.tasks == -1 {
		o.tasks = int(float64(o.overallRate) * o.duration.Seconds() / 3)
	}
	if o.batch == -1 {
		o.batch = int(float64(o.tenantRate) * o.duration.Seconds() / 10)
	}
	switch {
	case o.tasks < 0 || o.batch < 0 || o.exports < 0:
		return o, errors.New("--tasks, --batch and --exports must not be negative (-1 for --tasks and --batch: sized to --duration)")
	case o.tasks+o.batch+o.exports == 0:
		return o, errors.New("nothing to do: --tasks, --batch and --exports are all 0")
	case o.tenantRate < 1 || o.overallRate < 1 || o.exportCap < 1:
		return o, errors.New("--tenant-rate, --overall-rate and --export-cap must be at least 1")
	case o.servers < 1 || o.concurrency < 1:
		return o, errors.New("--servers and --concurrency must be at least 1")
	}
	return o, nil
}

// flagError is a command-line error the flag package has already reported.
type flagError struct{ error }
