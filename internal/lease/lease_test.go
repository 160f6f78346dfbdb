package lease

import (
	"testing"
	"time"
)

// shifting is four processes on one key of 100/s with a burst of 20,
// leases of 1 s, answers 2 ms away, and demand that shifts: all four
// flood; one goes quiet, another floods alone beside two small ones; one
// dies mid-lease; demand falls below the rate.
func shifting(seed uint64) simConfig {
	return simConfig{
		policy:     Policy{Rate: 100, Burst: 20},
		lease:      time.Second,
		rtt:        2 * time.Millisecond,
		seed:       seed,
		pad:        1.25,
		leaseAbove: 5,
		phases: []phase{
			{until: 6 * time.Second, demand: []float64{60, 60, 60, 60}},
			{until: 12 * time.Second, demand: []float64{0, 300, 10, 10}},
			{until: 18 * time.Second, demand: []float64{80, 80, -1, 80}},
			{until: 24 * time.Second, demand: []float64{20, 20, -1, 20}},
		},
	}
}

// usedWithin is the least share of what the policy and the demand allow
// that the fleet must admit once demand has been steady for half a phase
// (at least two leases), as issue 29 asks. Measured over seeds 1-7:
// 99.0-100.7% in every phase.
const usedWithin = 0.95

// TestSharesHoldTheEnvelopeAndUseTheRate runs shifting with two seeds.
// Every admission, in memory or by the rest, counts against one envelope:
// in no span of d seconds more than burst + rate*d, on the one clock of
// the run. After every script call the grants counted and the rest add up
// to at most the policy (checked in simulate). Once demand is steady the
// fleet admits at least usedWithin of what it may.
func TestSharesHoldTheEnvelopeAndUseTheRate(t *testing.T) {
	for _, seed := range []uint64{1, 2} {
		cfg := shifting(seed)
		res := simulate(t, cfg)
		over := mostOver(res.admitted, cfg.policy.Rate)
		t.Logf("figures: seed %d: %d asked, %d admitted (%d in memory), %d Redis calls (%.3f per unit asked), %d states checked; most over the rate in any span: %.2f units (burst %d)",
			seed, res.asks, len(res.admitted), res.local, res.calls, float64(res.calls)/float64(res.asks), res.checks, over, cfg.policy.Burst)
		if over > float64(cfg.policy.Burst)+1e-6 {
			t.Errorf("seed %d: the fleet admitted %.2f units over the rate in a span; the burst is %d", seed, over, cfg.policy.Burst)
		}
		for i, p := range cfg.phases {
			half := (p.until - phaseStart(cfg.phases, i)) / 2
			may := min(float64(res.askedIn[i]), cfg.policy.Rate*half.Seconds())
			got := float64(res.byPhase[i])
			t.Logf("figures: seed %d, phase %d, second half: %.0f admitted of %d asked, %.1f%% of the %.0f the policy allows them", seed, i+1, got, res.askedIn[i], 100*got/may, may)
			if got < usedWithin*may {
				t.Errorf("seed %d, phase %d: %.0f admitted in its second half, want at least %.0f%% of %.0f; last grants %v", seed, i+1, got, 100*usedWithin, may, res.grants)
			}
		}
	}
}

// TestSharesLeaveABurstOfOneToRedis: where leasing cannot help (a key of
// 10/s with a burst of 1, three processes asking 10/s each), no process
// keeps the burst to itself: the key is decided in Redis, each process
// gets a part of it, and the fleet admits what a burst of 1 can. (When
// one process could keep the whole burst, the others were held out: 16
// admitted over the whole run's last 6 s, by processes 2, 29 and 1.) A burst of 1
// admits a Poisson stream three times its rate at 1/(1/10 + 1/30) =
// 7.5/s: the token fills in 0.1 s, the next arrival comes 1/30 s later on
// average.
func TestSharesLeaveABurstOfOneToRedis(t *testing.T) {
	cfg := simConfig{
		policy: Policy{Rate: 10, Burst: 1},
		lease:  time.Second,
		rtt:    2 * time.Millisecond,
		phases: []phase{{until: 12 * time.Second, demand: []float64{10, 10, 10}}},
		seed:   3, pad: 1.5, leaseAbove: 5,
	}
	res := simulate(t, cfg)
	if over := mostOver(res.admitted, cfg.policy.Rate); over > 1+1e-6 {
		t.Errorf("the fleet admitted %.2f units over the rate in a span; the burst is 1", over)
	}
	got, may := float64(res.byPhase[0]), 7.5*6
	t.Logf("figures: %d admitted in the last 6 s (a burst of 1 admits %.0f of such arrivals), by process %v; %d in memory; last grants %v", res.byPhase[0], may, res.byProc, res.local, res.grants)
	if got < 0.85*may {
		t.Errorf("%.0f admitted in the last 6 s, want at least 85%% of %.0f", got, may)
	}
	for p, n := range res.byProc {
		if n < len(res.admitted)/6 {
			t.Errorf("process %d admitted %d of %d: held out", p, n, len(res.admitted))
		}
	}
}

// FuzzSharesHoldTheEnvelope: any demands (two phases of three processes,
// up to 2.5 times the rate each), burst, lease and latency keep the
// fleet within the envelope, and the grants and the rest within the
// policy after every call.
func FuzzSharesHoldTheEnvelope(f *testing.F) {
	f.Add(uint64(1), uint8(60), uint8(60), uint8(60), uint8(0), uint8(250), uint8(10), uint8(20), uint16(1000), uint8(2))
	f.Add(uint64(7), uint8(5), uint8(200), uint8(1), uint8(255), uint8(0), uint8(255), uint8(1), uint16(50), uint8(40))
	f.Fuzz(func(t *testing.T, seed uint64, a0, a1, a2, b0, b1, b2, burst uint8, leaseMs uint16, rttMs uint8) {
		demand := func(v uint8) float64 { return float64(v) } // rate 100: up to 2.55 times it
		lease := time.Duration(max(20, int(leaseMs)%3000)) * time.Millisecond
		cfg := simConfig{
			policy:     Policy{Rate: 100, Burst: max(1, int(burst))},
			lease:      lease,
			rtt:        time.Duration(int(rttMs)%int(lease/time.Millisecond/2+1)) * time.Millisecond,
			seed:       seed,
			pad:        1.25,
			leaseAbove: 5,
			phases: []phase{
				{until: 2 * time.Second, demand: []float64{demand(a0), demand(a1), demand(a2)}},
				{until: 4 * time.Second, demand: []float64{demand(b0), demand(b1), demand(b2)}},
			},
		}
		res := simulate(t, cfg)
		if over := mostOver(res.admitted, cfg.policy.Rate); over > float64(cfg.policy.Burst)+1e-6 {
			t.Errorf("the fleet admitted %.2f units over the rate in a span (%.9g); the burst is %d (grants %v)", over, over, cfg.policy.Burst, res.grants)
		}
	})
}
