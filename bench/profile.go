package main

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/jobthrottle/jobthrottle/lua"
	"github.com/redis/go-redis/v9"
)

// The fleet's -profile-scripts: each worker process runs a timed copy of
// every library script in place of the script itself, and the benchmark
// prints, per script and mode (its first argument), the calls a task and
// the time a call spent inside Redis, as the scripts' own TIME reads saw
// it ("-" for a script whose first argument is no mode). A timed copy
// wraps the script in a function, reads TIME before and after it, and
// adds the difference and a call to two fields of the hash profileKey:
// two TIME and two HINCRBY more a call, a few µs, so the times are a
// little high. It finds where a task's Redis time goes, script by script,
// which INFO cannot tell apart.

// profileKey is the hash the timed scripts add to: "<script>:<mode>:us"
// and "<script>:<mode>:n".
const profileKey = "jtprof"

// timedScripts returns, by the SHA1 of each library script as Redis runs
// it, the text of its timed copy: the scripts of package lua, and the
// worker's own (read from ../worker/lua/assembled, as the benchmark runs
// from bench/; missing, they are left untimed).
func timedScripts() (map[string]string, error) {
	timed := map[string]string{}
	add := func(fsys fs.FS, dir string) error {
		names, err := fs.Glob(fsys, path.Join(dir, "*.lua"))
		if err != nil {
			return err
		}
		for _, name := range names {
			text, err := fs.ReadFile(fsys, name)
			if err != nil {
				return err
			}
			sum := sha1.Sum(text)
			timed[hex.EncodeToString(sum[:])] = timedCopy(strings.TrimSuffix(path.Base(name), ".lua"), string(text))
		}
		return nil
	}
	if err := add(lua.Scripts, "assembled"); err != nil {
		return nil, err
	}
	if _, err := os.Stat("../worker/lua/assembled"); err == nil {
		if err := add(os.DirFS("../worker/lua/assembled"), "."); err != nil {
			return nil, err
		}
	}
	return timed, nil
}

// timedCopy wraps the script text, named name, so that it times itself.
func timedCopy(name, text string) string {
	return "local jt_t0 = redis.call('TIME')\n" +
		"local jt_r = (function()\n" + text + "\nend)()\n" +
		"local jt_t1 = redis.call('TIME')\n" +
		"local jt_m = tostring(ARGV[1])\n" +
		"if #jt_m > 2 then jt_m = '-' end\n" + // not a mode (lane.lua's first argument is an instant)
		"local jt_f = " + strconv.Quote(name+":") + " .. jt_m\n" +
		"redis.call('HINCRBY', '" + profileKey + "', jt_f .. ':us', (tonumber(jt_t1[1]) - tonumber(jt_t0[1])) * 1000000 + tonumber(jt_t1[2]) - tonumber(jt_t0[2]))\n" +
		"redis.call('HINCRBY', '" + profileKey + "', jt_f .. ':n', 1)\n" +
		"return jt_r\n"
}

// timeScripts loads the timed copies into rdb's Redis and has rdb run
// them in place of the library's scripts.
func timeScripts(ctx context.Context, rdb *redis.Client) error {
	timed, err := timedScripts()
	if err != nil {
		return err
	}
	to := map[string]string{}
	for sha, text := range timed {
		loaded, err := rdb.ScriptLoad(ctx, text).Result()
		if err != nil {
			return fmt.Errorf("loading the timed copy of %s: %w", sha, err)
		}
		to[sha] = loaded
	}
	rdb.AddHook(timingHook{to: to})
	return nil
}

// timingHook rewrites an EVALSHA of a library script into one of its timed
// copy. Added last, it rewrites after the other hooks counted the call
// under the script's own SHA.
type timingHook struct{ to map[string]string }

func (h timingHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h timingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.rewrite(cmd)
		return next(ctx, cmd)
	}
}

func (h timingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.rewrite(cmd)
		}
		return next(ctx, cmds)
	}
}

func (h timingHook) rewrite(cmd redis.Cmder) {
	args := cmd.Args()
	if len(args) < 2 || cmd.Name() != "evalsha" {
		return
	}
	if sha, ok := args[1].(string); ok {
		if to, ok := h.to[sha]; ok {
			args[1] = to
		}
	}
}

// scriptTimes is what the timed scripts added up, by "<script>:<mode>".
type scriptTimes map[string]struct{ calls, us int64 }

// readScriptTimes reads profileKey.
func readScriptTimes(ctx context.Context, rdb *redis.Client) (scriptTimes, error) {
	fields, err := rdb.HGetAll(ctx, profileKey).Result()
	if err != nil {
		return nil, err
	}
	times := scriptTimes{}
	for field, value := range fields {
		i := strings.LastIndexByte(field, ':')
		if i < 0 {
			continue
		}
		v, _ := strconv.ParseInt(value, 10, 64)
		t := times[field[:i]]
		switch field[i+1:] {
		case "us":
			t.us += v
		case "n":
			t.calls += v
		}
		times[field[:i]] = t
	}
	return times, nil
}

// add adds what the timed scripts did from from to to.
func (s scriptTimes) add(from, to scriptTimes) {
	for name, t := range to {
		f := from[name]
		sum := s[name]
		sum.calls += t.calls - f.calls
		sum.us += t.us - f.us
		s[name] = sum
	}
}

// printScriptTimes prints a fleet's script times, tasks tasks.
func printScriptTimes(w io.Writer, n, tasks int, times scriptTimes) {
	names := make([]string, 0, len(times))
	var total int64
	for name, t := range times {
		if t.calls > 0 {
			names = append(names, name)
			total += t.us
		}
	}
	slices.SortFunc(names, func(a, b string) int { return int(times[b].us - times[a].us) })
	fmt.Fprintf(w, "  N=%d: the library's scripts, timed inside Redis (-profile-scripts; %d µs a task in all):\n", n, total/int64(max(1, tasks)))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "\tscript:mode\tcalls/task\tµs/call\tµs/task\t\n")
	for _, name := range names {
		t := times[name]
		fmt.Fprintf(tw, "\t%s\t%.2f\t%.1f\t%.1f\t\n", name, float64(t.calls)/float64(tasks), float64(t.us)/float64(t.calls), float64(t.us)/float64(tasks))
	}
	_ = tw.Flush()
}
