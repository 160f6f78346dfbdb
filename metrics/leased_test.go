package metrics_test

import (
	"context"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// TestLeasedSharesCounted: a limiter with leased shares, asked until it
// decides in memory, shows its share's renewals as decisions of op share
// and its decisions made in memory in leased_decisions_total, which the
// allow decisions include.
func TestLeasedSharesCounted(t *testing.T) {
	tg := redistest.New(t)
	c, reg := newCollector(t)
	l, err := throttle.New(tg.NewClient(t), "leased", throttle.GCRA{Rate: throttle.PerSecond(1000), Burst: 100},
		throttle.WithPrefix(tg.Prefix), throttle.WithLeasedShares(200*time.Millisecond), throttle.WithObserver(c))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	leased := 0
	for deadline := time.Now().Add(5 * time.Second); leased < 20; time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d decisions in memory after 5 s", leased)
		}
		r, err := l.Allow(context.Background(), "k")
		if err != nil {
			t.Fatal(err)
		}
		if r.Leased {
			leased++
		}
	}
	got := samples(t, reg)
	inMemory := got[`jobthrottle_leased_decisions_total{limiter="leased"}`]
	allowed := got[`jobthrottle_decisions_total{limiter="leased",op="allow",outcome="admitted"}`] +
		got[`jobthrottle_decisions_total{limiter="leased",op="allow",outcome="throttled"}`]
	granted := got[`jobthrottle_decisions_total{limiter="leased",op="share",outcome="admitted"}`]
	t.Logf("figures: %s: %.0f allow decisions, %.0f of them in memory; %.0f shares granted", tg.Kind, allowed, inMemory, granted)
	if inMemory != float64(leased) || allowed < inMemory || granted < 1 {
		t.Errorf("leased_decisions_total %v (want %d), allow decisions %v, shares granted %v", inMemory, leased, allowed, granted)
	}
}
