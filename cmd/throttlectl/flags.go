package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// globals are the flags every command takes.
type globals struct {
	redis    redisAddress
	cluster  bool
	sentinel string // the master's name: --redis names its Sentinels
	prefix   string
	json     bool
	timeout  time.Duration
}

func defaultGlobals() globals {
	return globals{redis: redisFromEnv(), prefix: throttle.DefaultPrefix, timeout: 5 * time.Second}
}

// register defines the global flags on fs, with their current values as
// defaults: a command's flag set takes them again after the command name.
func (g *globals) register(fs *flag.FlagSet) {
	fs.Var(&g.redis, "redis", "Redis `address`: host:port, or a URL redis://[user:password@]host:port[/db] (rediss:// for TLS); $REDIS_URL, then $REDIS_ADDR, when not given; with --cluster, comma-separated host:port seeds or one URL with more seeds as ?addr=host:port")
	fs.BoolVar(&g.cluster, "cluster", g.cluster, "--redis names seeds of a Redis Cluster (read by go-redis's ParseClusterURL when a URL); top scans every master")
	fs.StringVar(&g.sentinel, "sentinel", g.sentinel, "the `master` name: --redis names Sentinels that know the master by it, comma-separated host:port or one URL read by go-redis's ParseFailoverURL (more Sentinels as ?addr=host:port; the URL's password is the Sentinels', the master's is ?password=)")
	fs.StringVar(&g.prefix, "prefix", g.prefix, "key `prefix` of the limiters (their WithPrefix)")
	fs.BoolVar(&g.json, "json", g.json, "write one JSON document instead of a table")
	fs.DurationVar(&g.timeout, "timeout", g.timeout, "how long to wait for Redis: peek and reset as a whole, top per SCAN page and per key")
}

// check reports what is wrong with the global flags.
func (g *globals) check() error {
	if g.timeout <= 0 {
		return usagef("--timeout must be positive, got %s", g.timeout)
	}
	if err := keyspace.CheckPrefix(g.prefix); err != nil {
		return usagef("--prefix: %v", err)
	}
	_, err := g.redisOptions()
	return err
}

// policyFlags name the limiter a key belongs to: --policy, or --config with
// --limiter.
type policyFlags struct {
	policy  string
	config  string
	limiter string
	name    string
}

func (p *policyFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&p.policy, "policy", "", "the limiter's `policy`, as Policy.String prints it: gcra:10/1s:5 (or gcra:10/s:5), tb:10/1s:5, lb:10/1m:5, fw:25/1m, sl:25/1s, sw:25/1s, quota:1000/day:UTC, conc:3/30s")
	fs.StringVar(&p.config, "config", "", "JSON `file` mapping limiter names to policies, e.g. {\"tenant\": \"gcra:10/1s:5\"}")
	fs.StringVar(&p.limiter, "limiter", "", "`name` of the limiter in --config")
	fs.StringVar(&p.name, "name", "", "`name` of the limiter (as given to throttle.New): its keys carry its name, and its policy is the one stored for it (throttlectl set), else the one its processes registered, else --policy")
}

// newFlagSet returns a flag set that reports nothing itself: throttlectl
// writes its errors in one line, and help on stdout.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// commandFlags returns the flag set of a's command, with the global flags
// on it too.
func (a *app) commandFlags() *flag.FlagSet {
	fs := newFlagSet("throttlectl " + a.command.name)
	a.globals.register(fs)
	return fs
}

// parseCommand parses a command's arguments, flags and operands in any
// order ("--" ends the flags), and checks the global flags. On --help it
// writes the command's help to stdout and returns flag.ErrHelp.
func (a *app) parseCommand(fs *flag.FlagSet, args []string) ([]string, error) {
	var operands []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fmt.Fprintf(a.stdout, "usage: throttlectl [global flags] %s %s\n\n%s\n\nflags:\n", a.command.name, a.command.args, a.command.summary)
				printDefaults(a.stdout, fs)
			}
			return nil, usageFlagError(err)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			operands = append(operands, rest...)
			break
		}
		operands = append(operands, rest[0])
		args = rest[1:]
	}
	return operands, a.globals.check()
}

// usageFlagError marks a flag package error as a usage error, leaving
// flag.ErrHelp as it is.
func usageFlagError(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	return usageError{err}
}

// printDefaults writes fs's flags and their defaults to w.
func printDefaults(w io.Writer, fs *flag.FlagSet) {
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

// oneOperand returns the single operand a command takes.
func (a *app) oneOperand(operands []string, what string) (string, error) {
	switch {
	case len(operands) == 0:
		return "", usagef("%s: missing %s", a.command.name, what)
	case len(operands) > 1:
		return "", usagef("%s: want one %s, got %d arguments: %q", a.command.name, what, len(operands), operands)
	case operands[0] == "":
		return "", usagef("%s: empty %s", a.command.name, what)
	}
	return operands[0], nil
}
