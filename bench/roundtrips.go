package main

import (
	"context"
	"crypto/sha1"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/jobthrottle/jobthrottle/lua"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// counter counts the round trips a client makes: commands and pipelines,
// but for those go-redis sends itself when it opens a connection (HELLO,
// CLIENT SETINFO, AUTH, SELECT), which its callers do not ask for.
// With libraryOnly it counts only the library's on a client it shares with
// asynq (see ofLibrary).
type counter struct {
	// registry counts the writes of the registry of names among n (a
	// limiter's first decision in a process writes it, then
	// hourly): a process's cost, not a task's.
	n, pings, registry atomic.Int64
	libraryOnly        bool
	// byTask, when set, counts the round trips made for each task: those
	// whose context carries asynq's task ID (the middleware passes the
	// handler's context down), by that ID.
	byTask *taskTrips
}

// taskTrips counts round trips by asynq task ID. Safe for concurrent use.
type taskTrips struct {
	mu sync.Mutex
	n  map[string]int64
}

func (t *taskTrips) add(ctx context.Context) {
	if t == nil {
		return
	}
	id, ok := asynq.GetTaskID(ctx)
	if !ok {
		return
	}
	t.mu.Lock()
	t.n[id]++
	t.mu.Unlock()
}

// snapshot returns a copy of the counts.
func (t *taskTrips) snapshot() map[string]int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.n)
}

func (c *counter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !connectionSetup(cmd) && (!c.libraryOnly || ofLibrary(cmd)) {
			c.n.Add(1)
			c.byTask.add(ctx)
		}
		if cmd.Name() == "ping" {
			c.pings.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) == 0 || !connectionSetup(cmds[0]) && (!c.libraryOnly || slices.ContainsFunc(cmds, ofLibrary)) {
			c.n.Add(1)
			c.byTask.add(ctx)
			if cmds[0].Name() == "hset" && len(cmds[0].Args()) > 1 && cmds[0].Args()[1] == keyspace.Registry("throttle:") {
				c.registry.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// ofLibrary tells the library's commands from asynq's on a client both
// use: a PING (asynq sends one only when its server starts), a script of
// the library's (by its SHA1, see librarySHAs: the worker's return lane
// touches asynq's keys alone), or another command whose first key is not
// one of asynq's ("asynq:..."). A hand-over's enqueue (asynq's own script)
// counts as asynq's.
func ofLibrary(cmd redis.Cmder) bool {
	args := cmd.Args()
	switch name := cmd.Name(); {
	case name == "ping":
		return true
	case name == "evalsha" || name == "evalsha_ro":
		return len(args) > 1 && librarySHAs[fmt.Sprint(args[1])]
	case name == "eval" || name == "eval_ro":
		return len(args) > 1 && librarySHAs[fmt.Sprintf("%x", sha1.Sum([]byte(fmt.Sprint(args[1]))))]
	}
	if len(args) < 2 {
		return false
	}
	key, ok := args[1].(string)
	return ok && !strings.HasPrefix(key, "asynq:")
}

// librarySHAs holds the SHA1 of every Redis script of the library, as
// Redis runs them: the limiters' (package lua) and the worker's, read from
// ../worker/lua/assembled (the benchmark runs in bench/). Filled by
// loadLibrarySHAs.
var librarySHAs = map[string]bool{}

// loadLibrarySHAs fills librarySHAs.
func loadLibrarySHAs() error {
	add := func(fsys fs.FS, dir string) error {
		entries, err := fs.ReadDir(fsys, dir)
		if err != nil {
			return err
		}
		for _, e := range entries {
			body, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
			if err != nil {
				return err
			}
			librarySHAs[fmt.Sprintf("%x", sha1.Sum(body))] = true
		}
		return nil
	}
	if err := add(lua.Scripts, "assembled"); err != nil {
		return err
	}
	if err := add(os.DirFS(".."), "worker/lua/assembled"); err != nil {
		return fmt.Errorf("the worker's scripts (run the benchmark in bench/): %w", err)
	}
	return nil
}

// connectionSetup reports a command go-redis sends when it opens a
// connection.
func connectionSetup(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "hello", "client", "auth", "select":
		return true
	}
	return false
}

// flood is a flood of checks on one over-limit key.
type flood struct {
	checks, redisCalls int64
	elapsed            time.Duration
}

// denyFlood sends checks from 8 goroutines for d at a key over its limit
// (1 per hour), and counts what reached Redis.
func denyFlood(addr, prefix string, cache int, d time.Duration) (flood, error) {
	c := &counter{}
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 16})
	defer rdb.Close()
	rdb.AddHook(c)
	opts := []throttle.Option{throttle.WithPrefix(prefix)}
	if cache > 0 {
		opts = append(opts, throttle.WithDenyCache(cache))
	}
	l, err := throttle.New(rdb, "l", throttle.GCRA{Rate: throttle.PerHour(1), Burst: 1}, opts...)
	if err != nil {
		return flood{}, err
	}
	ctx := context.Background()
	if _, err := l.Allow(ctx, "flooded"); err != nil {
		return flood{}, err
	}
	c.n.Store(0)
	var checks atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < d {
				if _, err := l.Allow(ctx, "flooded"); err == nil {
					checks.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return flood{checks: checks.Load(), redisCalls: c.n.Load(), elapsed: time.Since(start)}, nil
}

// batch compares deciding keys one by one with AllowMany.
type batch struct {
	keys                     int
	oneByOne, together       time.Duration
	oneByOneRTs, togetherRTs int64
}

func batchVersusOneByOne(addr, prefix string, keys []string) (batch, error) {
	c := &counter{}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	rdb.AddHook(c)
	l, err := throttle.New(rdb, "l", throttle.GCRA{Rate: throttle.PerSecond(huge), Burst: huge}, throttle.WithPrefix(prefix))
	if err != nil {
		return batch{}, err
	}
	ctx := context.Background()
	if _, err := l.Allow(ctx, "warm-up"); err != nil { // loads the script
		return batch{}, err
	}
	b := batch{keys: len(keys)}
	c.n.Store(0)
	start := time.Now()
	for _, k := range keys {
		if _, err := l.Allow(ctx, k); err != nil {
			return b, err
		}
	}
	b.oneByOne, b.oneByOneRTs = time.Since(start), c.n.Load()
	reqs := make([]throttle.Request, len(keys))
	for i, k := range keys {
		reqs[i] = throttle.Request{Key: k, N: 1}
	}
	c.n.Store(0)
	start = time.Now()
	if _, err := l.AllowMany(ctx, reqs); err != nil {
		return b, err
	}
	b.together, b.togetherRTs = time.Since(start), c.n.Load()
	return b, nil
}
