// Command bench compares jobthrottle with github.com/go-redis/redis_rate
// (v10, GCRA) on one Redis, side by side in one run, and prints one report:
// decisions per second and latency at 1, 8 and 64 goroutines on one hot key
// and on 10,000 keys; the Go side's cost per decision; the server's time per
// script call; memory per key; the ceiling redis-benchmark reaches with
// EVALSHA of the same script; the deny cache under a flood; and batched
// decisions. It is a module of its own, so the library never depends on its
// peers.
//
//	cd bench && go run .                  # starts a redis-server on loopback
//	cd bench && go run . -redis 127.0.0.1:6379
//
// "go run . fleet" runs the fleet benchmark instead: asynq worker processes
// behind the worker middleware, and what they cost Redis (see fleetMain).
// "go run . calls" measures what one call costs Redis at a fleet's pace
// (see callsMain). "go run . shares" measures leased shares
// (throttle.WithLeasedShares) beside a round trip per decision and
// redis_rate (see sharesMain).
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jobthrottle/jobthrottle/lua"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

func main() {
	if os.Getenv(childScenario) != "" {
		os.Exit(fleetChild())
	}
	subcommands := map[string]func(args []string) error{"calls": callsMain, "fleet": fleetMain, "shares": sharesMain}
	if sub, ok := subcommands[firstArg()]; ok {
		if err := sub(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	addr := flag.String("redis", "", "host:port of the Redis to measure; empty: start a redis-server on a free loopback port")
	perCell := flag.Duration("cell", 3*time.Second, "measuring time of each contender at each concurrency and key set")
	rounds := flag.Int("rounds", 3, "rounds each cell's time is split into, contenders rotated each round")
	flag.Parse()
	if err := run(*addr, *perCell, *rounds); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(addr string, perCell time.Duration, rounds int) error {
	at, stop, err := redisAt(addr)
	if err != nil {
		return err
	}
	defer stop()
	addr = at
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	port, _ := strconv.Atoi(portText)
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	version, err := serverVersion(ctx, admin)
	if err != nil {
		return err
	}
	var id [4]byte
	_, _ = rand.Read(id[:])
	prefix := "jtbench:" + hex.EncodeToString(id[:]) + ":"
	defer cleanUp(ctx, admin, prefix)

	// Each contender has a pool as large as the most goroutines.
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
	defer rdb.Close()
	cs, err := contenders(rdb, prefix)
	if err != nil {
		return err
	}
	many := make([]string, 10_000)
	for i := range many {
		many[i] = fmt.Sprintf("%stenant-%06d", prefix, i) // redis_rate has no prefix of ours
	}
	hot := []string{prefix + "hot"}

	fmt.Printf("# jobthrottle vs redis_rate, %s\n\n", time.Now().UTC().Format("2006-01-02 15:04 MST"))
	fmt.Printf("redis-server %s at %s; %d CPUs; each cell %s in %d rotated rounds.\n\n", version, addr, numCPU(), perCell, rounds)

	// 1. Throughput and latency.
	concurrency := []int{1, 8, 64}
	table := throughput(cs, concurrency, map[string][]string{"hot": hot, "many": many}, perCell, rounds)
	fmt.Println("## Decisions per second and latency")
	fmt.Println()
	fmt.Println("| keys | goroutines | limiter | decisions/s | ours ÷ redis_rate | p50 | p99 | errors |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for _, set := range []string{"1 hot key", "10000 keys"} {
		for _, workers := range concurrency {
			cells := table[set][workers]
			theirs := cells[0].rate()
			for i, c := range cs {
				ratio := "—"
				if c.ours {
					ratio = fmt.Sprintf("%.2f×", cells[i].rate()/theirs)
				}
				fmt.Printf("| %s | %d | %s | %.0f | %s | %s | %s | %d |\n", set, workers, c.name, cells[i].rate(), ratio,
					micro(cells[i].percentile(0.5)), micro(cells[i].percentile(0.99)), cells[i].errors)
			}
		}
	}

	// 2. The ceiling: redis-benchmark, EVALSHA of our GCRA script.
	gcra := cs[1].limiter
	sha, keys, args, err := scriptCall(ctx, admin, gcra)
	if err != nil {
		return err
	}
	fmt.Println()
	fmt.Println("## The ceiling: redis-benchmark, 64 connections, EVALSHA of our GCRA script")
	fmt.Println()
	fmt.Println("One call per round trip is the shape of a decision; 16 pipelined per connection is what the server itself can take.")
	fmt.Println()
	fmt.Println("| keys | EVALSHA/s, 1 per round trip | EVALSHA/s, 16 pipelined | GCRA at 64 goroutines | ÷ 1 per round trip | ÷ pipelined | GCRA, no coalescing | ÷ 1 per round trip |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for _, c := range []struct {
		set    string
		random int
		keys   []string
	}{{"1 hot key", 0, keys}, {"10000 keys", 10_000, randomized(keys)}} {
		call := append(append([]string{"EVALSHA", sha, strconv.Itoa(len(c.keys))}, c.keys...), args...)
		single, err := ceiling(host, port, 64, 1, 200_000, c.random, call...)
		if err != nil {
			return err
		}
		piped, err := ceiling(host, port, 64, 16, 1_000_000, c.random, call...)
		if err != nil {
			return err
		}
		own, alone := table[c.set][64][1].rate(), table[c.set][64][aloneGCRA].rate()
		fmt.Printf("| %s | %.0f | %.0f | %.0f | %.0f%% | %.0f%% | %.0f | %.0f%% |\n", c.set, single, piped, own, 100*own/single, 100*own/piped, alone, 100*alone/single)
	}

	// 3. The Go side's cost of one decision.
	fmt.Println()
	fmt.Println("## Go side: cost of one decision (testing.Benchmark, RunParallel, ReportAllocs)")
	fmt.Println()
	fmt.Println("| limiter | ns/op | B/op | allocs/op |")
	fmt.Println("|---|---|---|---|")
	for _, c := range goSideContenders(cs) {
		g := measureGoSide(c.decide, many)
		fmt.Printf("| %s | %d | %d | %d |\n", c.name, g.nsPerOp, g.bytesPerOp, g.allocsPerOp)
	}

	// 4. The server's cost: time per script call, memory per key.
	fmt.Println()
	fmt.Println("## Redis side: time per script call and memory per key")
	fmt.Println()
	fmt.Println("Time per call: the median of 5 rounds of 5,000 sequential decisions over 10,000 keys, at the policies above, the limiters rotated each round. Memory: at 10 a minute (burst 5) with the caller key `tenant-000001`, and used_memory's growth over 10,000 such keys.")
	fmt.Println()
	fmt.Println("| limiter | µs per call (INFO commandstats) | MEMORY USAGE of one key | used_memory per key | key |")
	fmt.Println("|---|---|---|---|---|")
	memCs, err := memoryContenders(rdb, prefix+"m:")
	if err != nil {
		return err
	}
	cleanUp(ctx, admin, prefix)                                            // the keys of the runs above, which would expire meanwhile
	times, err := serverTimes(ctx, admin, cs[:len(memCs)], many, 5, 5_000) // the coalescing ones run the same scripts
	if err != nil {
		return err
	}
	cleanUp(ctx, admin, prefix)
	for i, c := range cs[:len(memCs)] {
		usec := times[i]
		// Caller keys as a user's: "tenant-000001". Each limiter keeps them
		// under its own prefix ("rate:" or "throttle:<policy>:"), so the
		// runs do not meet; they are deleted afterwards.
		memKeys := make([]string, 10_000)
		for j := range memKeys {
			memKeys[j] = fmt.Sprintf("tenant-%06d", j+1)
		}
		m, err := measureMemory(ctx, admin, memCs[i].decide, memKeys, memCs[i].keyOf)
		if err != nil {
			return err
		}
		fmt.Printf("| %s | %.2f | %d B | %.0f B | `%s` |\n", c.name, usec, m.usage, m.perKey, m.exampleOf)
		for _, k := range memKeys {
			admin.Del(ctx, memCs[i].keyOf(k))
		}
	}

	// 5. Fewer round trips: the deny cache and batches.
	fmt.Println()
	fmt.Println("## Fewer round trips")
	fmt.Println()
	plain, err := denyFlood(addr, prefix+"f1:", 0, 2*time.Second)
	if err != nil {
		return err
	}
	cached, err := denyFlood(addr, prefix+"f2:", 1000, 2*time.Second)
	if err != nil {
		return err
	}
	fmt.Println("A flood of checks from 8 goroutines for 2 s on one key over its limit (GCRA 1 per hour):")
	fmt.Println()
	fmt.Println("| deny cache | checks | Redis round trips | checks/s |")
	fmt.Println("|---|---|---|---|")
	fmt.Printf("| off | %d | %d | %.0f |\n", plain.checks, plain.redisCalls, float64(plain.checks)/plain.elapsed.Seconds())
	fmt.Printf("| on | %d | %d | %.0f |\n", cached.checks, cached.redisCalls, float64(cached.checks)/cached.elapsed.Seconds())
	fmt.Printf("\nRound trips per check fell %.0f× (%.4f → %.6f).\n\n", (float64(plain.redisCalls)/float64(plain.checks))/(float64(cached.redisCalls)/float64(cached.checks)),
		float64(plain.redisCalls)/float64(plain.checks), float64(cached.redisCalls)/float64(cached.checks))
	b, err := batchVersusOneByOne(addr, prefix+"b:", many[:1000])
	if err != nil {
		return err
	}
	fmt.Println("1,000 decisions on 1,000 keys:")
	fmt.Println()
	fmt.Println("| how | round trips | time |")
	fmt.Println("|---|---|---|")
	fmt.Printf("| Allow, one by one | %d | %s |\n", b.oneByOneRTs, b.oneByOne.Round(time.Millisecond))
	fmt.Printf("| AllowMany | %d | %s |\n", b.togetherRTs, b.together.Round(time.Millisecond))
	return nil
}

// scriptCall returns the SHA, keys and arguments of one GCRA decision on
// the hot key (the layout lua/meter.lua's header gives), with the script
// loaded, for redis-benchmark.
func scriptCall(ctx context.Context, admin *redis.Client, l *throttle.Limiter) (string, []string, []string, error) {
	text, err := fs.ReadFile(lua.Scripts, "assembled/meter.lua")
	if err != nil {
		return "", nil, nil, err
	}
	sha, err := admin.ScriptLoad(ctx, string(text)).Result()
	if err != nil {
		return "", nil, nil, err
	}
	p := l.Policy().(throttle.GCRA)
	num, den := p.Rate.Per.Microseconds(), int64(p.Rate.N)
	g := gcd(num, den)
	num, den = num/g, den/g
	keys := []string{l.Key("hot")} // a decision reads no block key: a meter keeps its block in its state
	args := []string{"0", "1", strconv.Itoa(p.Burst), strconv.FormatInt(num, 10), strconv.FormatInt(den, 10)}
	return sha, keys, args, nil
}

// randomized makes redis-benchmark spread a call over 10,000 keys: it
// replaces __rand_int__ in each argument.
func randomized(keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = strings.Replace(k, "{hot}", "{__rand_int__}", 1)
	}
	return out
}

func numCPU() int { return runtime.NumCPU() }

func micro(d time.Duration) string {
	return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
}

func serverVersion(ctx context.Context, rdb *redis.Client) (string, error) {
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return "", fmt.Errorf("the Redis does not answer: %w", err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v, nil
		}
	}
	return "?", nil
}

func cleanUp(ctx context.Context, rdb *redis.Client, prefix string) {
	for _, pattern := range []string{prefix + "*", "*" + prefix + "*"} {
		iter := rdb.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			rdb.Del(ctx, iter.Val())
		}
	}
}

// firstArg returns the command line's first argument, "" when it has none.
func firstArg() string {
	if len(os.Args) > 1 {
		return os.Args[1]
	}
	return ""
}

// redisAt returns addr and a stop that does nothing, or, for an empty
// addr, the address of a redis-server it starts (see startRedis) and how to
// stop it.
func redisAt(addr string) (string, func(), error) {
	if addr != "" {
		return addr, func() {}, nil
	}
	return startRedis()
}

// startRedis starts a redis-server on a free loopback port, without
// persistence, and returns its address and how to stop it.
func startRedis() (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	dir, err := os.MkdirTemp("", "jtbench")
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("starting redis-server (install it, or pass -redis): %w", err)
	}
	stop := func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		os.RemoveAll(dir)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	for range 100 {
		if rdb.Ping(context.Background()).Err() == nil {
			return addr, stop, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	return "", nil, fmt.Errorf("redis-server on port %d did not answer", port)
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
