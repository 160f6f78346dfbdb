package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/jobthrottle/jobthrottle/lua"
	"github.com/redis/go-redis/v9"
)

// tally counts a client's round trips by what they ran: a command's name,
// or the script an EVALSHA ran (by the first line of its file), for the
// breakdown JT_FLEET_DETAIL=1 prints to stderr when a worker process ends.
type tally struct {
	mu    sync.Mutex
	n     map[string]int
	names map[string]string
}

func newTally() *tally {
	t := &tally{n: map[string]int{}, names: map[string]string{}}
	entries, _ := lua.Scripts.ReadDir("assembled")
	for _, e := range entries {
		b, _ := lua.Scripts.ReadFile("assembled/" + e.Name())
		t.names[redis.NewScript(string(b)).Hash()] = e.Name()
	}
	return t
}

func (t *tally) label(cmd redis.Cmder) string {
	args := cmd.Args()
	name := strings.ToLower(fmt.Sprint(args[0]))
	if (name == "evalsha" || name == "evalsha_ro") && len(args) > 1 {
		if s, ok := t.names[fmt.Sprint(args[1])]; ok {
			// The scripts that do several things say which by ARGV[1].
			if nkeys, err := strconv.Atoi(fmt.Sprint(args[2])); err == nil && len(args) > 3+nkeys &&
				(s == "concurrency.lua" || s == "room.lua" || s == "meter_claim.lua") {
				s += " mode " + fmt.Sprint(args[3+nkeys])
			}
			return s
		}
		return "script " + fmt.Sprint(args[1])[:8]
	}
	return name
}

func (t *tally) DialHook(next redis.DialHook) redis.DialHook { return next }
func (t *tally) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		t.mu.Lock()
		t.n[t.label(cmd)]++
		t.mu.Unlock()
		return next(ctx, cmd)
	}
}
func (t *tally) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		t.mu.Lock()
		t.n["pipeline"]++
		t.mu.Unlock()
		return next(ctx, cmds)
	}
}

func (t *tally) print() {
	t.mu.Lock()
	defer t.mu.Unlock()
	var keys []string
	for k := range t.n {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return t.n[keys[i]] > t.n[keys[j]] })
	for _, k := range keys {
		fmt.Fprintf(os.Stderr, "  %6d %s\n", t.n[k], k)
	}
}
