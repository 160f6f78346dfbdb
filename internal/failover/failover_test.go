//go:build failover

package failover

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// resumeWithin is issue 30's promise: decisions on a failed master's keys
// resume within 5 s of the fault.
const resumeWithin = 5 * time.Second

// setup is a topology under test: a client on it, the master of the hot
// key (the one the test fails), and the keys of the many that master
// serves.
type setup struct {
	client redis.UniversalClient
	victim *node
	// onVictim reports whether the victim serves a key of the many.
	onVictim func(key string) bool
	// demoted reports whether the old master serves as a replica now.
	demoted func() bool
	// promoted reports whether the victim's replica is a master now.
	promoted func() bool
}

func clusterSetup(t *testing.T) setup {
	c := startCluster(t)
	victim, replica := c.masterAndReplica(hotKey)
	served := map[string]bool{}
	for i := range manyKeys {
		key := fmt.Sprintf("m%d", i)
		served[key] = c.masterOf(t, key) == victim
	}
	return setup{
		client:   c.client(t),
		victim:   victim,
		onVictim: func(key string) bool { return served[key] },
		demoted:  func() bool { return victim.role(t) == "slave" },
		promoted: func() bool { return replica.role(t) == "master" },
	}
}

func sentinelSetup(t *testing.T) setup {
	s := startSentinels(t)
	return setup{
		client:   s.client(t),
		victim:   s.master,
		onVictim: func(string) bool { return true },
		demoted:  func() bool { return s.master.role(t) == "slave" },
		promoted: func() bool { return s.replica.role(t) == "master" },
	}
}

// TestFailover kills or freezes the master of the hot key under load, on a
// Redis Cluster with a replica per master and on a master and replica
// behind three Sentinels, with go-redis's clients on their defaults. It
// asserts: decisions on the failed master's keys resume within 5 s; every
// call returns within its bound; a fail-closed limiter never admits what
// Redis did not decide, a fail-open one never errors, nothing is refused;
// no 1 s window before the fault or after the resumption admits more than
// the policy allows, and no window across it more than one burst over (the
// admissions the promotion may lose); a frozen master rejoins as a
// replica.
func TestFailover(t *testing.T) {
	t.Parallel() // beside TestAsynqFleetThroughFailover, which mostly waits
	for _, topo := range []string{"cluster", "sentinel"} {
		for _, fault := range []string{"kill", "freeze"} {
			t.Run(topo+"/"+fault, func(t *testing.T) {
				var s setup
				if topo == "cluster" {
					s = clusterSetup(t)
				} else {
					s = sentinelSetup(t)
				}
				failover(t, s, fault)
			})
		}
	}
}

func failover(t *testing.T, s setup, fault string) {
	l := startLoad(t, s.client, "jt-failover:")
	begin := time.Now()
	time.Sleep(2 * time.Second)
	faultAt := time.Now()
	if fault == "kill" {
		s.victim.kill()
	} else {
		s.victim.freeze(t)
	}
	var promotedAt time.Time
	waitUntil(t, 30*time.Second, "decisions on the hot key did not resume", func() bool {
		if promotedAt.IsZero() && s.promoted() {
			promotedAt = time.Now()
		}
		return l.quietSince("hot-closed", faultAt, time.Second) && l.quietSince("hot-open", faultAt, time.Second)
	})
	waitUntil(t, 30*time.Second, "the replica was not promoted", func() bool {
		if promotedAt.IsZero() && s.promoted() {
			promotedAt = time.Now()
		}
		return !promotedAt.IsZero()
	})
	if fault == "freeze" {
		s.victim.thaw(t)
	}
	time.Sleep(2 * time.Second)
	calls := l.finish()
	end := time.Now()

	overrun := checkCalls(t, calls)
	report := []string{fmt.Sprintf("the replica was a master %s after the fault (polled every 50 ms)", promotedAt.Sub(faultAt).Round(10*time.Millisecond))}
	for _, name := range []string{"hot-closed", "hot-open", "many-closed"} {
		mine := of(calls, name, "")
		if name == "many-closed" {
			var onVictim []call
			for _, c := range mine {
				if s.onVictim(c.key) {
					onVictim = append(onVictim, c)
				}
			}
			mine = onVictim
		}
		after := resumed(mine, faultAt)
		failed := 0
		for _, c := range mine {
			if c.failed() {
				failed++
			}
		}
		report = append(report, fmt.Sprintf("%s resumed after %s (%d of %d calls undecided)", name, after.Round(time.Millisecond), failed, len(mine)))
		if after > resumeWithin {
			t.Errorf("%s: decisions resumed %s after the fault, want within %s", name, after.Round(time.Millisecond), resumeWithin)
		}
	}
	// The limits, on the hot key and on each of the many.
	resumeAt := faultAt.Add(resumed(append(of(calls, "hot-closed", ""), of(calls, "hot-open", "")...), faultAt))
	checkWindows := func(name, key string, rate, burst int) (before, across, afterward int) {
		mine := of(calls, name, key)
		before = mostAdmitted(mine, begin, faultAt)
		afterward = mostAdmitted(mine, resumeAt, end)
		across = mostAdmitted(mine, begin, end)
		if before > rate+burst || afterward > rate+burst {
			t.Errorf("%s %q: %d admitted in a 1 s window before the fault, %d after it resumed; the policy allows %d",
				name, key, before, afterward, rate+burst)
		}
		if name != "hot-open" && across > rate+2*burst {
			t.Errorf("%s %q: %d admitted in a 1 s window across the failover; at most one burst over the policy is %d",
				name, key, across, rate+2*burst)
		}
		return before, across, afterward
	}
	b, a, w := checkWindows("hot-closed", hotKey, hotRate, hotBurst)
	report = append(report, fmt.Sprintf("hot-closed most admitted in 1 s: %d before, %d after, %d across (policy %d)", b, w, a, hotRate+hotBurst))
	b, _, w = checkWindows("hot-open", hotKey, hotRate, hotBurst)
	report = append(report, fmt.Sprintf("hot-open most decided by Redis in 1 s: %d before, %d after", b, w))
	mostAcross := 0
	for i := range manyKeys {
		_, a, _ := checkWindows("many-closed", fmt.Sprintf("m%d", i), manyRate, manyBurst)
		mostAcross = max(mostAcross, a)
	}
	report = append(report, fmt.Sprintf("many-closed most admitted in 1 s across, of any key: %d (policy %d)", mostAcross, manyRate+manyBurst))
	report = append(report, fmt.Sprintf("%d calls; the longest overran its bound by %s (jitter allowed %s)", len(calls), overrun.Round(time.Millisecond), boundJitter))
	if fault == "freeze" {
		waitUntil(t, 30*time.Second, "the frozen master did not rejoin as a replica", s.demoted)
		report = append(report, "the frozen master rejoined as a replica")
	}
	for _, line := range report {
		t.Logf("figures: %s", line)
	}
}
