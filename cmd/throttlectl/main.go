// Command throttlectl looks into the limits jobthrottle keeps in Redis and
// resets them: it answers "why is tenant X's work waiting, and for how
// long?".
//
//	throttlectl [global flags] peek --policy POLICY KEY
//	throttlectl [global flags] peek --config FILE --limiter NAME KEY
//	throttlectl [global flags] peek REDIS-KEY
//	throttlectl [global flags] reset --policy POLICY KEY
//	throttlectl [global flags] peek --name NAME [--policy POLICY] KEY
//	throttlectl [global flags] top [--all] [--limit N] [--config FILE]
//	throttlectl [global flags] set [--key KEY | --replace] NAME POLICY
//	throttlectl [global flags] get NAME
//	throttlectl [global flags] unset [--key KEY] NAME
//	throttlectl [global flags] serve [--addr HOST:PORT] [--actions] [--config FILE]
//
// Redis is named by --redis, else the REDIS_URL environment variable, else
// REDIS_ADDR, else 127.0.0.1:6379: host:port, or a URL as go-redis's
// ParseURL reads it, redis://[user:password@]host:port[/db] (rediss:// for
// TLS; query parameters such as dial_timeout too), which gives the AUTH
// password, the ACL user and the database. With --cluster it names a Redis
// Cluster: comma-separated host:port seeds, or one URL as ParseClusterURL
// reads it, more seeds as ?addr=host:port. Messages show a URL's password
// as xxxxx.
//
// A policy is written as Policy.String prints it, the form the library
// writes inside its Redis keys: gcra:10/1s:5 (GCRA, 10 per second, burst
// 5), tb:10/1s:5 (TokenBucket), lb:10/1m:5 (LeakyBucket, capacity 5),
// fw:25/1m (FixedWindow, 25 a minute), sl:25/1s (SlidingLog), sw:25/1s
// (SlidingWindow), quota:1000/day:Europe/Paris (Quota) and conc:3/30s (a
// ConcurrencyLimiter: 3 holders, 30 s leases). A period may be a bare unit,
// as the docs write rates: gcra:10/s:5 is gcra:10/1s:5. KEY is the caller key
// given to the limiter ("tenant-42"). The --config file maps names to
// policies: {"tenant": "gcra:10/1s:5", "exports": "conc:3/30s"}.
//
// peek shows the policy's numbers (RATE and BURST for a GCRA or
// TokenBucket, RATE and CAPACITY for a LeakyBucket, LIMIT and WINDOW for a
// window, LIMIT and PERIOD for a quota; top shows RATE and BURST for every
// key), whether a unit would be admitted now, how many remain of the
// burst, capacity or limit (REMAINING), how long
// until the next one would be admitted (RETRY-AFTER), until the key is back
// to full capacity (RESET-AFTER) and until a block set by Limiter.BlockFor
// ends (BLOCKED-FOR); for a concurrency cap, its holders and free slots.
// peek without --name or --limiter takes a full Redis key as top lists
// it. reset forgets a key's state and lifts its block. A key with no state
// in Redis under the limiter asked for is full: both show it so, and note
// on stderr the limiters that do hold state for that caller key, found
// with SCAN on every master (a mistyped name or key shows there). top scans the prefix with SCAN (never KEYS),
// on every master of a Cluster, and lists the keys throttled now (nothing
// admitted, or blocked), longest wait first; --all lists every key.
//
// Every limiter keeps its state under its name; peek and reset find its
// policy in force where it is stored (set), else where its processes
// recorded it (the registry of names), else in --policy or --config. A
// limiter created with WithLivePolicies can have its policy changed while
// it runs: set stores a policy for the name
// (with --key, for one caller key), and every process applies it within a
// second; unset removes it, and the policy in code applies again; get
// shows what is stored. A policy that is invalid, or of another algorithm
// than the limiters of that name, is refused (exit status 2); set
// --replace moves the name to another algorithm: it removes every policy
// stored for the name and stores the new one, which limiters of its
// algorithm apply, while those of the old one still running keep the
// policy they have. peek and
// reset take such a limiter's keys with --name (the policy stored for it
// applies; --policy gives the one in code when none is), or as full Redis
// keys; top peeks them with their stored policy, or the one --config
// gives for the name.
//
// serve serves the web dashboard (package dashboard) over the limiters
// under the prefix, on --addr, by default 127.0.0.1:8080: loopback only,
// since it shows every tenant's keys; give another address to reach it
// from elsewhere. It prints "dashboard: http://ADDR/" once listening, and
// stops gracefully on SIGINT or SIGTERM. It is read-only unless --actions
// is given: then the page can reset, block and unblock keys and set or
// remove stored policies, each action guarded by a token the operator
// types into the page, $THROTTLECTL_TOKEN when set, else a random one
// printed once on stderr. Its --config gives the policies in code of named
// limiters, as top's does.
//
// Redis keeps no record of when a key began to be throttled, so the answer
// to "since when" is the state's own: how long the wait and the block still
// last, and how long until the key is whole again.
//
// Output is an aligned table, durations rounded up to the millisecond, or
// with --json one JSON document, durations both as text and in
// microseconds: an object for peek and reset, an array for top. Errors are one line on stderr;
// the exit status is 1 for a failure at run time (Redis unreachable, no
// state for the key) and 2 for a usage error (bad flag, policy, address or
// config). Global flags may also follow the command.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/redis/go-redis/v9"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// Exit statuses.
const (
	exitOK      = 0
	exitFailure = 1 // the command could not do its work
	exitUsage   = 2 // the command line was wrong
)

// command is one subcommand.
type command struct {
	name    string
	args    string // what follows the name in its usage line
	summary string
	run     func(a *app, args []string) error
}

var commands = []command{
	{"peek", "(--policy POLICY | --config FILE --limiter NAME) KEY | REDIS-KEY", "show one key's state: admitted now?, remaining, retry-after, reset-after, block", runPeek},
	{"reset", "(--policy POLICY | --config FILE --limiter NAME) KEY | REDIS-KEY", "forget one key's state and lift its block", runReset},
	{"top", "[--all] [--limit N] [--config FILE]", "list the keys throttled now, longest wait first", runTop},
	{"set", "[--key KEY | --replace] NAME POLICY", "store the policy of the limiter named NAME (or of one KEY); every process applies it within a second", runSet},
	{"get", "NAME", "show the policies stored for the limiter named NAME", runGet},
	{"unset", "[--key KEY] NAME", "remove a stored policy: the policy in code applies again within a second", runUnset},
	{"serve", "[--addr HOST:PORT] [--actions] [--config FILE]", "serve the web dashboard on --addr, by default 127.0.0.1:8080: loopback only", runServe},
}

// run is the whole command: it returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	redis.SetLogger(silentLogger{})
	err := dispatch(args, stdout, stderr)
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	fmt.Fprintln(stderr, "throttlectl: "+oneLine(err.Error()))
	if errors.As(err, new(usageError)) {
		return exitUsage
	}
	return exitFailure
}

// dispatch parses the global flags and runs the command they lead to.
func dispatch(args []string, stdout, stderr io.Writer) error {
	a := &app{stdout: stdout, stderr: stderr, globals: defaultGlobals()}
	fs := newFlagSet("throttlectl")
	a.globals.register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(stdout, fs)
		}
		return usageFlagError(err)
	}
	rest := fs.Args()
	if len(rest) == 0 {
		return usagef("no command: want peek, reset, top, set, get, unset or serve (see throttlectl --help)")
	}
	if rest[0] == "help" {
		printUsage(stdout, fs)
		return nil
	}
	for _, c := range commands {
		if c.name == rest[0] {
			a.command = c
			return c.run(a, rest[1:])
		}
	}
	return usagef("unknown command %q: want peek, reset, top, set, get, unset or serve", rest[0])
}

// printUsage writes the top-level help.
func printUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprint(w, `usage: throttlectl [global flags] <command> [flags] [args]

Looks into the limits jobthrottle keeps in Redis, resets them, changes
the policies of named limiters while they run, and serves a web dashboard.

commands:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-6s %s\n         %s\n", c.name, c.args, c.summary)
	}
	fmt.Fprint(w, `
Redis: --redis, else $REDIS_URL, else $REDIS_ADDR, else 127.0.0.1:6379; as
host:port or redis://[user:password@]host:port[/db] (rediss:// for TLS).
With --cluster: host:port seeds separated by commas, or one URL with more
seeds as ?addr=host:port. With --sentinel MASTER: the Sentinels of the
master so named, the same way; a URL's password is the Sentinels', the
master's is ?password=.

POLICY is written as Policy.String prints it: gcra:10/1s:5, tb:10/1s:5,
lb:10/1m:5, fw:25/1m, sl:25/1s, sw:25/1s, quota:1000/day:UTC, or conc:3/30s
for a concurrency cap; a bare unit is one of it (gcra:10/s:5). A --config
FILE maps names to policies: {"tenant": "gcra:10/1s:5"}; for top it gives the policy in code of limiters that have none stored or registered.
A limiter keeps its keys under its name: peek --name NAME KEY. Its policy
is the one stored for it, else the one its processes registered, else
--policy's.
serve listens on loopback (127.0.0.1:8080) unless --addr names another
address; with --actions the token is $THROTTLECTL_TOKEN, else a random one
printed on stderr. It stops on Ctrl-C (SIGINT) or SIGTERM.
Exit status: 0 done, 1 failed (Redis), 2 usage error (an unknown name too).

global flags (also accepted after the command):
`)
	printDefaults(w, fs)
}

// app is what every command works with.
type app struct {
	globals
	command command
	stdout  io.Writer
	stderr  io.Writer // for notes; errors go up to run
	// newName reports set --new, once set's flags are parsed; nil for the
	// other commands.
	newName func() bool
}

// usageError is a mistake on the command line: exit status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// oneLine joins the lines of an error message.
func oneLine(s string) string {
	return lineBreaks.Replace(strings.TrimSpace(s))
}

var lineBreaks = strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ")

// silentLogger keeps go-redis's own log lines off stderr: throttlectl
// reports every failure itself, in one line.
type silentLogger struct{}

func (silentLogger) Printf(context.Context, string, ...any) {}
