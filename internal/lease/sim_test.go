package lease

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// phase is a span of the simulation with each process's demand (units per
// second; a negative demand is a process that has died: it asks nothing and
// renews nothing).
type phase struct {
	until  time.Duration
	demand []float64
}

// simConfig is one simulated fleet on one key.
type simConfig struct {
	policy Policy
	lease  time.Duration
	rtt    time.Duration // a script runs rtt/2 after its request is sent; its answer arrives rtt/2 later
	phases []phase
	seed   uint64
	pad    float64 // how much more than its measured demand a process asks for
	// leaseAbove is the demand (units per second) from which a process
	// asks for a share; below it, it gives its share back.
	leaseAbove float64
}

// simResult is what the fleet admitted, on the one clock of the run (the
// driven miniredis clock is the processes' clock).
type simResult struct {
	admitted []time.Duration   // every admission, in order
	byProc   []int             // admissions of each process
	byPhase  []int             // admissions in each phase's second half
	askedIn  []int             // units asked in each phase's second half
	checks   int               // states read and checked
	calls    int               // Redis calls made
	asks     int               // units asked
	local    int               // admissions decided in memory
	grants   map[string]string // last grant per holder, for failure messages
}

// pending is a renewal on its way: the script runs at run, the answer
// is applied at apply.
type pending struct {
	proc      int
	sent, run time.Duration
	apply     time.Duration
	demand    float64
	grant     Grant
	ran       bool
}

// simulate runs cfg with 1 ms steps on miniredis with a driven clock. Each
// process asks units at its phase's demand (Poisson arrivals), decides in
// memory under its share when it holds one and else asks the rest in
// Redis, and renews its share every half lease (asking for 1.5 times the
// demand it measured) once its demand is 5/s or more. After every script
// call it checks the state Redis holds: the grants counted and the rest
// never add up to more than the policy.
func simulate(t *testing.T, cfg simConfig) simResult {
	t.Helper()
	m := miniredis.RunT(t)
	m.SetTime(time.Unix(1_800_000_000, 0))
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { client.Close() })
	ctx := context.Background()
	store := NewStore(client)
	rng := rand.New(rand.NewPCG(cfg.seed, 1))
	procs := len(cfg.phases[0].demand)
	shares := make([]Share, procs)
	nextRenew := make([]time.Duration, procs)
	ewma := make([]float64, procs)
	asking := make([]bool, procs) // asked for a share: its demand is its own
	var inflight []*pending
	res := simResult{byPhase: make([]int, len(cfg.phases)), askedIn: make([]int, len(cfg.phases)), byProc: make([]int, procs), grants: map[string]string{}}
	start := time.Unix(1_800_000_000, 0)
	const step = time.Millisecond
	key := Keys{State: "lease:{sim}", Block: "lease:{sim}:block"}
	setClock := func(at time.Duration) {
		m.SetTime(start.Add(at))
	}
	check := func(at time.Duration) {
		t.Helper()
		st, err := store.Read(ctx, key, cfg.policy)
		if err != nil {
			t.Fatal(err)
		}
		res.checks++
		rate, burst := st.RestRate, st.RestBurst
		for _, h := range st.Holders {
			rate += h.CountedRate
			burst += h.CountedBurst
		}
		if rate > cfg.policy.Rate*(1+1e-9) || burst > float64(cfg.policy.Burst)*(1+1e-9) {
			t.Fatalf("at %s the grants and the rest count %.6g/s and %.6g units; the policy is %g/s, %d: %+v",
				at, rate, burst, cfg.policy.Rate, cfg.policy.Burst, st)
		}
	}
	phaseAt := func(at time.Duration) int {
		for i, p := range cfg.phases {
			if at < p.until {
				return i
			}
		}
		return len(cfg.phases) - 1
	}
	end := cfg.phases[len(cfg.phases)-1].until
	for at := time.Duration(0); at < end; at += step {
		setClock(at)
		ns := int64(at)
		ph := phaseAt(at)
		// Renewals on their way: scripts run, answers arrive.
		for _, p := range inflight {
			if !p.ran && at >= p.run {
				g, err := store.Grant(ctx, key, fmt.Sprint("p", p.proc), cfg.policy, Ask{Demand: p.demand, Lease: cfg.lease, Least: 1})
				if err != nil {
					t.Fatal(err)
				}
				res.calls++
				p.grant, p.ran = g, true
				res.grants[fmt.Sprint("p", p.proc)] = fmt.Sprintf("at %s: %.3g/s burst %.3g (asked %.3g/s)", at, g.Rate, g.Burst, p.demand)
				check(at)
			}
		}
		kept := inflight[:0]
		for _, p := range inflight {
			if p.ran && at >= p.apply {
				if cfg.phases[ph].demand[p.proc] >= 0 {
					shares[p.proc].Apply(p.grant, int64(p.sent), ns)
				}
				continue
			}
			kept = append(kept, p)
		}
		inflight = kept
		for proc := range procs {
			d := cfg.phases[ph].demand[proc]
			if d < 0 {
				continue // dead: asks nothing, renews nothing
			}
			// Poisson arrivals in this step.
			secondHalf := at >= (cfg.phases[ph].until+phaseStart(cfg.phases, ph))/2
			for n := poisson(rng, d*step.Seconds()); n > 0; n-- {
				res.asks++
				if secondHalf {
					res.askedIn[ph]++
				}
				local := shares[proc].Take(ns, 1)
				ok := local.OK
				if !local.Held || (!local.OK && local.Full) {
					dec, err := store.TakeRest(ctx, key, cfg.policy, 1, asking[proc])
					if err != nil {
						t.Fatal(err)
					}
					res.calls++
					ok = dec.Allowed
				} else if local.OK {
					res.local++
				}
				if ok {
					res.byProc[proc]++
					res.admitted = append(res.admitted, at)
					if secondHalf {
						res.byPhase[ph]++
					}
				}
			}
			if at >= nextRenew[proc] {
				nextRenew[proc] = at + cfg.lease/2
				ewma[proc] = (ewma[proc] + shares[proc].Demand(ns)) / 2
				demand := ewma[proc]
				held := shares[proc].Held(ns)
				if demand < cfg.leaseAbove && held {
					// Too little demand to lease: its share goes back.
					shares[proc].Stop()
					asking[proc] = false
					if err := store.Release(ctx, key, fmt.Sprint("p", proc), cfg.policy); err != nil {
						t.Fatal(err)
					}
					res.calls++
					check(at)
				}
				if demand >= cfg.leaseAbove {
					asking[proc] = true
					inflight = append(inflight, &pending{proc: proc, sent: at, run: at + cfg.rtt/2, apply: at + cfg.rtt, demand: cfg.pad * demand})
				}
			}
		}
	}
	return res
}

func phaseStart(phases []phase, i int) time.Duration {
	if i == 0 {
		return 0
	}
	return phases[i-1].until
}

// poisson draws a Poisson count of mean mu (small mu: Knuth's method).
func poisson(rng *rand.Rand, mu float64) int {
	if mu <= 0 {
		return 0
	}
	l, k, p := math.Exp(-mu), 0, 1.0
	for {
		p *= rng.Float64()
		if p <= l {
			return k
		}
		k++
	}
}

// mostOver returns the largest excess of admissions over rate*d in any
// span of d between two admissions (the envelope's burst must cover it).
func mostOver(admitted []time.Duration, rate float64) float64 {
	sort.Slice(admitted, func(i, j int) bool { return admitted[i] < admitted[j] })
	best, worst := 0.0, 0.0 // best: the largest rate*t_i - i seen
	for j, at := range admitted {
		v := rate*at.Seconds() - float64(j)
		if j == 0 || v > best {
			best = v
		}
		// admissions i..j: j-i+1 - rate*(t_j - t_i)
		worst = max(worst, float64(j+1)-rate*at.Seconds()+best)
	}
	return worst
}
