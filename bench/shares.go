package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// sharesMain runs "go run . shares": leased shares (throttle.WithLeasedShares)
// beside today's per-decision path and redis_rate, in one run on one Redis.
// Processes are limiters of one name, each on a client of its own, in this
// one OS process (on this 2-core machine, separate processes would share
// the same cores).
func sharesMain(args []string) error {
	fs := flag.NewFlagSet("shares", flag.ContinueOnError)
	addr := fs.String("redis", "", "host:port of the Redis to measure; empty: start a redis-server on a free loopback port")
	cell := fs.Duration("cell", 3*time.Second, "measuring time of each cell")
	shift := fs.Duration("shift", 60*time.Second, "length of the run of shifting demand (six phases); 0 skips it")
	if err := fs.Parse(args); err != nil {
		return err
	}
	at, stop, err := redisAt(*addr)
	if err != nil {
		return err
	}
	defer stop()
	*addr = at
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: *addr})
	defer admin.Close()
	version, err := serverVersion(ctx, admin)
	if err != nil {
		return err
	}
	var id [4]byte
	_, _ = rand.Read(id[:])
	prefix := "jtbench:" + hex.EncodeToString(id[:]) + ":"
	defer cleanUp(ctx, admin, prefix)
	fmt.Printf("# Leased shares, %s\n\nredis-server %s at %s; %d CPUs; cells of %s; shifting demand over %s.\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), version, *addr, numCPU(), *cell, *shift)

	b := sharesBench{addr: *addr, prefix: prefix, admin: admin}
	if *cell <= 0 {
		return b.shifting(*shift)
	}
	if err := b.oneProcess(*cell); err != nil {
		return err
	}
	if err := b.eightProcesses(*cell); err != nil {
		return err
	}
	if *shift <= 0 {
		return nil
	}
	return b.shifting(*shift)
}

// sharesBench holds what the sections share.
type sharesBench struct {
	addr, prefix string
	n            int           // names limiters apart between cells
	admin        *redis.Client // reads Redis's clock
}

// calls counts the commands a client sends.
type calls struct{ n atomic.Int64 }

func (c *calls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *calls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name != "hello" && name != "client" {
			c.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (c *calls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// quiet keeps the limiters' logs out of the report (a process that dies
// fails its renewals on purpose).
var quiet = throttle.WithLogger(slog.New(slog.DiscardHandler))

// kind is one way of deciding: redis_rate, ours per decision, ours leased.
type kind struct {
	name string
	make func(rdb redis.UniversalClient, name string, p throttle.GCRA) (func(context.Context, string) (bool, bool, error), func())
}

func kinds() []kind {
	return []kind{
		{"redis_rate GCRA", func(rdb redis.UniversalClient, _ string, p throttle.GCRA) (func(context.Context, string) (bool, bool, error), func()) {
			c := theirsAt(rdb, p)
			return func(ctx context.Context, key string) (bool, bool, error) {
				ok, err := c.decide(ctx, key)
				return ok, false, err
			}, func() {}
		}},
		{"GCRA, a round trip each", oursAt([]throttle.Option{quiet})},
		{"GCRA, leased shares", oursAt([]throttle.Option{quiet, throttle.WithLeasedShares(0)})},
	}
}

// oursAt makes our GCRA with opts.
func oursAt(opts []throttle.Option) func(redis.UniversalClient, string, throttle.GCRA) (func(context.Context, string) (bool, bool, error), func()) {
	return func(rdb redis.UniversalClient, name string, p throttle.GCRA) (func(context.Context, string) (bool, bool, error), func()) {
		l, err := throttle.New(rdb, name, p, opts...)
		if err != nil {
			panic(err) // the policies here are valid
		}
		return func(ctx context.Context, key string) (bool, bool, error) {
				r, err := l.Allow(ctx, key)
				return r.Allowed, r.Leased, err
			}, func() {
				_ = l.Close(context.Background())
			}
	}
}

// process is one process's limiter of a kind, on its own client.
type process struct {
	decide func(context.Context, string) (bool, bool, error)
	close  func()
	rdb    *redis.Client
	calls  *calls
}

func (b *sharesBench) processes(k kind, n int, p throttle.GCRA) []process {
	b.n++
	name := fmt.Sprintf("shares-%d", b.n)
	var ps []process
	for range n {
		c := &calls{}
		rdb := redis.NewClient(&redis.Options{Addr: b.addr, PoolSize: 16})
		rdb.AddHook(c)
		decide, closeIt := k.make(rdb, name, p)
		ps = append(ps, process{decide: decide, close: closeIt, rdb: rdb, calls: c})
	}
	return ps
}

func closeAll(ps []process) {
	for _, p := range ps {
		p.close()
		p.rdb.Close()
	}
}

// warm asks key until the leased kinds decide in memory (up to 5 s).
func warm(ps []process, key string) {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		all := true
		for _, p := range ps {
			if _, leased, _ := p.decide(context.Background(), key); !leased {
				all = false
			}
		}
		if all {
			return
		}
	}
}

// oneProcess: one process, the limit far above demand, 1 and 8 goroutines.
func (b *sharesBench) oneProcess(d time.Duration) error {
	fmt.Println("## One process, the limit far above demand")
	fmt.Println()
	fmt.Println("| goroutines | limiter | decisions/s | × a round trip each | p50 | p99 | Redis calls per decision |")
	fmt.Println("|---|---|---|---|---|---|---|")
	huge := throttle.GCRA{Rate: throttle.PerSecond(100_000_000), Burst: 10_000_000}
	for _, workers := range []int{1, 8} {
		var base float64
		for _, k := range kinds() {
			ps := b.processes(k, 1, huge)
			key := b.prefix + "one"
			warm(ps, key)
			before := ps[0].calls.n.Load()
			var c cell
			c.run(func(ctx context.Context, key string) (bool, error) {
				ok, _, err := ps[0].decide(ctx, key)
				return ok, err
			}, workers, []string{key}, d)
			slices.Sort(c.latencies)
			perDecision := float64(ps[0].calls.n.Load()-before) / float64(c.decisions)
			closeAll(ps)
			ratio := "—"
			if k.name == "GCRA, a round trip each" {
				base = c.rate()
			} else if base > 0 {
				ratio = fmt.Sprintf("%.0f×", c.rate()/base)
			}
			fmt.Printf("| %d | %s | %.0f | %s | %s | %s | %.4f |\n", workers, k.name, c.rate(), ratio, fine(c.percentile(0.5)), fine(c.percentile(0.99)), perDecision)
		}
	}
	fmt.Println()
	return nil
}

// paced asks key every 1/perSecond from each process until end, noting
// when each admission was made, and returns the admissions, decisions,
// their latencies and the Redis calls made.
func paced(ps []process, key string, perSecond func(proc int, since time.Duration) float64, start, end time.Time) (admitted []time.Time, decisions int, lat []time.Duration, callsMade int64) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	before := int64(0)
	for _, p := range ps {
		before += p.calls.n.Load()
	}
	for i, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Time
			var ls []time.Duration
			next := start
			for {
				rate := perSecond(i, time.Since(start))
				if rate <= 0 {
					next = time.Now().Add(10 * time.Millisecond)
				} else {
					next = next.Add(time.Duration(float64(time.Second) / rate))
				}
				if next.After(end) {
					break
				}
				if w := time.Until(next); w > 0 {
					time.Sleep(w)
				}
				if rate <= 0 {
					continue
				}
				t0 := time.Now()
				ok, _, err := p.decide(context.Background(), key)
				t1 := time.Now()
				ls = append(ls, t1.Sub(t0))
				if err == nil && ok {
					mine = append(mine, t1)
				}
			}
			mu.Lock()
			admitted = append(admitted, mine...)
			lat = append(lat, ls...)
			decisions += len(ls)
			mu.Unlock()
		}()
	}
	wg.Wait()
	for _, p := range ps {
		callsMade += p.calls.n.Load()
	}
	slices.SortFunc(admitted, func(a, b time.Time) int { return a.Compare(b) })
	slices.Sort(lat)
	return admitted, decisions, lat, callsMade - before
}

// mostInSecond is the most admissions in any span of one second.
func mostInSecond(ts []time.Time) int {
	most, j := 0, 0
	for i := range ts {
		for ts[i].Sub(ts[j]) >= time.Second {
			j++
		}
		most = max(most, i-j+1)
	}
	return most
}

func pct(lat []time.Duration, p float64) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	return lat[int(float64(len(lat)-1)*p)]
}

// eightProcesses: eight processes on one key, the limit far above demand
// (each asking as fast as it can) and at half of demand (each asking 500
// times a second, the limit 2,000/s with a burst of 200).
func (b *sharesBench) eightProcesses(d time.Duration) error {
	fmt.Println("## Eight processes on one key")
	fmt.Println()
	fmt.Println("Far above demand: each process asks as fast as one goroutine can. At 2× demand: each asks 500 times a second, the limit 2,000/s (burst 200).")
	fmt.Println()
	fmt.Println("| load | limiter | decisions/s | admitted/s | most admitted in any 1 s (allowed) | p50 | p99 | Redis calls per decision |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	huge := throttle.GCRA{Rate: throttle.PerSecond(100_000_000), Burst: 10_000_000}
	for _, k := range kinds() {
		ps := b.processes(k, 8, huge)
		key := b.prefix + "eight-" + k.name
		warm(ps, key)
		var c cell
		var mu sync.Mutex
		var wg sync.WaitGroup
		before := int64(0)
		for _, p := range ps {
			before += p.calls.n.Load()
		}
		for _, p := range ps {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var one cell
				one.run(func(ctx context.Context, key string) (bool, error) {
					ok, _, err := p.decide(ctx, key)
					return ok, err
				}, 1, []string{key}, d)
				mu.Lock()
				c.decisions += one.decisions
				c.latencies = append(c.latencies, one.latencies...)
				c.elapsed = max(c.elapsed, one.elapsed)
				mu.Unlock()
			}()
		}
		wg.Wait()
		after := int64(0)
		for _, p := range ps {
			after += p.calls.n.Load()
		}
		closeAll(ps)
		slices.Sort(c.latencies)
		fmt.Printf("| far above demand | %s | %.0f | %.0f | — | %s | %s | %.4f |\n", k.name, c.rate(), c.rate(), fine(c.percentile(0.5)), fine(c.percentile(0.99)), float64(after-before)/float64(c.decisions))
	}
	limit := throttle.GCRA{Rate: throttle.PerSecond(2000), Burst: 200}
	for _, k := range kinds() {
		ps := b.processes(k, 8, limit)
		key := b.prefix + "half-" + k.name
		warmUp := time.Now()
		paced(ps, key, func(int, time.Duration) float64 { return 500 }, warmUp, warmUp.Add(5*time.Second))
		start := time.Now()
		admitted, decisions, lat, made := paced(ps, key, func(int, time.Duration) float64 { return 500 }, start, start.Add(d))
		closeAll(ps)
		fmt.Printf("| 2× demand | %s | %.0f | %.0f | %d (2200) | %s | %s | %.4f |\n", k.name, float64(decisions)/d.Seconds(), float64(len(admitted))/d.Seconds(),
			mostInSecond(admitted), fine(pct(lat, 0.5)), fine(pct(lat, 0.99)), float64(made)/float64(decisions))
	}
	fmt.Println()
	return nil
}

// shifting runs eight processes with leased shares on one key of 2,000/s
// (burst 200) through six phases of demand and reports every second.
func (b *sharesBench) shifting(total time.Duration) error {
	phase := total / 6
	demands := [][8]float64{
		{500, 500, 500, 500, 500, 500, 500, 500},  // 2× the limit, even
		{0, 0, 0, 0, 1000, 1000, 1000, 1000},      // half go quiet, half flood
		{3000, 100, 100, 100, 100, 100, 100, 100}, // one floods beside small ones
		{250, 250, 250, 250, 250, 250, 250, 250},  // exactly the limit
		{100, 100, 100, 100, 100, 100, 100, 100},  // below the limit
		{1000, 1000, 1000, 1000, -1, -1, -1, -1},  // half die, half flood
	}
	ps := b.processes(kinds()[2], 8, throttle.GCRA{Rate: throttle.PerSecond(2000), Burst: 200})
	key := b.prefix + "shifting"
	redisFrom, err := b.admin.Time(context.Background()).Result()
	if err != nil {
		return err
	}
	start := time.Now()
	end := start.Add(total)
	dead := map[int]bool{}
	var deadMu sync.Mutex
	admitted, decisions, _, made := paced(ps, key, func(proc int, since time.Duration) float64 {
		i := min(int(since/phase), len(demands)-1)
		d := demands[i][proc]
		if d < 0 {
			deadMu.Lock()
			if !dead[proc] {
				dead[proc] = true
				_ = ps[proc].rdb.Close() // dies: nothing given back
			}
			deadMu.Unlock()
			return 0
		}
		return d
	}, start, end)
	closeAll(ps)
	redisTo, err := b.admin.Time(context.Background()).Result()
	if err != nil {
		return err
	}
	local := time.Since(start)
	drift := (redisTo.Sub(redisFrom).Seconds() - local.Seconds()) / local.Seconds() * 1e6
	fmt.Println("## Shifting demand, eight processes with leased shares, one key of 2,000/s (burst 200)")
	fmt.Println()
	fmt.Printf("Six phases of %s; leases of 1.5 s. Each row is one second on this process's clock; the last column is what was admitted in it against the least of the limit and the demand.\n\n", phase)
	fmt.Println("| second | phase | demand/s | admitted | admitted ÷ min(limit, demand) |")
	fmt.Println("|---|---|---|---|---|")
	secs := int(total / time.Second)
	counts := make([]int, secs)
	for _, t := range admitted {
		if s := int(t.Sub(start) / time.Second); s >= 0 && s < secs {
			counts[s]++
		}
	}
	for s := range secs {
		i := min(int(time.Duration(s)*time.Second/phase), len(demands)-1)
		demand := 0.0
		for _, d := range demands[i] {
			demand += max(0, d)
		}
		fmt.Printf("| %d | %d | %.0f | %d | %.1f%% |\n", s, i+1, demand, counts[s], 100*float64(counts[s])/min(2000, demand))
	}
	// Back to 95%: from when on, in half-second steps, every half second
	// of the phase admitted at least 95% of what the limit and demand allow.
	fmt.Println()
	for i := range demands {
		from, to := start.Add(time.Duration(i)*phase), start.Add(time.Duration(i+1)*phase)
		demand := 0.0
		for _, d := range demands[i] {
			demand += max(0, d)
		}
		want := 0.95 * min(2000, demand) / 2
		steps := int(phase / (500 * time.Millisecond))
		halves := make([]int, steps)
		for _, t := range admitted {
			if !t.Before(from) && t.Before(to) {
				halves[int(t.Sub(from)/(500*time.Millisecond))]++
			}
		}
		back := steps
		for k := steps - 1; k >= 0 && float64(halves[k]) >= want; k-- {
			back = k
		}
		if back == steps {
			fmt.Printf("Phase %d: not back to 95%% within the phase.\n", i+1)
			continue
		}
		fmt.Printf("Phase %d: every half second at 95%% or more of %.0f/s from %.1f s after its start.\n", i+1, min(2000, demand), float64(back)/2)
	}
	fmt.Printf("\nMost admitted in any 1 s: %d (the policy allows 2,200: 2,000 and the burst). %d decisions, %.4f Redis calls per decision.\n",
		mostInSecond(admitted), decisions, float64(made)/float64(decisions))
	fmt.Printf("\nClocks: over the run's %.1f s, Redis's clock (TIME) ran %+.1f ppm against this process's monotonic clock, which times each lease here (%.3f ms over a lease of 1.5 s; a share stops here one round trip before Redis stops counting it).\n",
		local.Seconds(), drift, drift*1.5e-3)
	return nil
}

// fine writes a latency in microseconds, with its nanoseconds below 10 µs
// (a decision in memory takes well under one).
func fine(d time.Duration) string {
	if d < 10*time.Microsecond {
		return fmt.Sprintf("%.2f µs", float64(d)/float64(time.Microsecond))
	}
	return micro(d)
}
