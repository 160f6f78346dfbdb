package throttle_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// leaseEndAllowance is how late after a share's end TestLeasedSharesLapse
// may still see a decision made under it: the time between the decision
// and the test reading the clock, on a busy machine.
const leaseEndAllowance = 20 * time.Millisecond

// TestLeasedSharesLapseWhenRedisStops: with shares out, Redis stops for
// longer than a lease. No decision is made under a share after its lease
// ends (the server stopped before the last renewal was sent); a
// fail-closed limiter then errors and a fail-open one admits Degraded.
// When Redis is back, shares are granted again.
func TestLeasedSharesLapseWhenRedisStops(t *testing.T) {
	const lease = 300 * time.Millisecond
	srv := redistest.StartServer(t, redistest.ServerOptions{})
	tg := srv.Target(t)
	policy := throttle.GCRA{Rate: throttle.PerSecond(1000), Burst: 100}
	var closed, open *throttle.Limiter
	for _, failure := range []throttle.FailurePolicy{throttle.FailClosed, throttle.FailOpen} {
		l, err := throttle.New(tg.NewClient(t), "lapse", policy, throttle.WithPrefix(tg.Prefix), throttle.WithLeasedShares(lease),
			throttle.WithFailurePolicy(failure), throttle.WithTimeout(50*time.Millisecond), throttle.WithLogger(nil))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		if failure == throttle.FailClosed {
			closed = l
		} else {
			open = l
		}
	}
	ctx := context.Background()
	leasedWithin := func(l *throttle.Limiter, d time.Duration) bool {
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
			if r, err := l.Allow(ctx, "k"); err == nil && r.Leased {
				return true
			}
		}
		return false
	}
	for _, l := range []*throttle.Limiter{closed, open} {
		if !leasedWithin(l, 5*time.Second) {
			t.Fatal("no share granted within 5 s at 500 asks a second")
		}
	}
	srv.Stop(t)
	stopped := time.Now()
	var lastLeased time.Time
	var errs, degraded int
	for time.Since(stopped) < 3*lease {
		for _, l := range []*throttle.Limiter{closed, open} {
			r, err := l.Allow(ctx, "k")
			now := time.Now()
			switch {
			case err == nil && r.Leased:
				lastLeased = now
			case err != nil:
				if !errors.Is(err, throttle.ErrUnavailable) {
					t.Fatalf("after the stop: %v, want ErrUnavailable", err)
				}
				if l == open {
					t.Fatalf("a fail-open limiter errored: %v", err)
				}
				errs++
			case r.Degraded:
				if l == closed {
					t.Fatal("a fail-closed limiter admitted Degraded")
				}
				degraded++
			default:
				t.Fatalf("after the stop, a decision neither leased, failed nor degraded: %+v", r)
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Logf("figures: %s: the last decision under a share %s after Redis stopped (leases of %s); then %d errors (fail-closed), %d degraded admissions (fail-open)",
		srv.Kind, lastLeased.Sub(stopped).Round(time.Millisecond), lease, errs, degraded)
	if lastLeased.Sub(stopped) > lease+leaseEndAllowance {
		t.Errorf("a decision under a share %s after Redis stopped, past the lease of %s", lastLeased.Sub(stopped), lease)
	}
	if errs == 0 || degraded == 0 {
		t.Errorf("after the leases: %d errors, %d degraded; want both limiters deciding under their failure policy", errs, degraded)
	}
	srv.Start(t)
	for _, l := range []*throttle.Limiter{closed, open} {
		if !leasedWithin(l, 5*time.Second) {
			t.Error("no share granted again within 5 s of Redis's return")
		}
	}
}

// TestLeasedSharesFollowALivePolicy: two processes hold shares of GCRA
// 200/s (burst 20, leases of 300 ms) and ask 300 times a second in all; the
// policy is lowered to 50/s (burst 5) in the store. From 2 s after the
// change (a second for the limiters to read it, then a lease for the
// shares to shrink) the fleet admits at most the new policy's envelope
// and at least leaseUseWithin of its rate.
func TestLeasedSharesFollowALivePolicy(t *testing.T) {
	tg := redistest.New(t)
	store, err := throttle.NewPolicyStore(tg.NewClient(t), tg.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	var ls []*throttle.Limiter
	for range 2 {
		l, err := throttle.New(tg.NewClient(t), "live-leased", throttle.GCRA{Rate: throttle.PerSecond(200), Burst: 20},
			throttle.WithPrefix(tg.Prefix), throttle.WithLeasedShares(300*time.Millisecond), throttle.WithLivePolicies(), throttle.WithLogger(nil))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		ls = append(ls, l)
	}
	offset := redistest.ClockOffset(t, tg.NewClient(t))
	var changed time.Time
	go func() {
		time.Sleep(1500 * time.Millisecond)
		if err := store.Set(context.Background(), "live-leased", throttle.GCRA{Rate: throttle.PerSecond(50), Burst: 5}); err != nil {
			t.Error(err)
		}
	}()
	start := time.Now()
	changed = start.Add(1500 * time.Millisecond)
	got, _ := hammerLeased(t, ls, "k", time.Second/150, start.Add(5500*time.Millisecond), offset)
	var after []admission
	for _, a := range got {
		if a.at.After(changed.Add(2 * time.Second)) {
			after = append(after, a)
		}
	}
	span := start.Add(5500 * time.Millisecond).Sub(changed.Add(2 * time.Second)).Seconds()
	excess := worstExcess(after, 50)
	rate := float64(len(after)) / span
	t.Logf("figures: %s: from 2 s after the policy went from 200/s to 50/s: %.1f/s admitted, most beyond 50/s in any span %.2f (burst 5)", tg.Kind, rate, excess)
	if excess > 5+leaseClockAllowance {
		t.Errorf("%.2f admitted beyond 50/s in a span, 2 s after the change; the new burst is 5", excess)
	}
	if rate < leaseUseWithin*50 {
		t.Errorf("%.1f/s admitted after the change, want at least %.0f%% of 50/s", rate, 100*leaseUseWithin)
	}
}

// TestLeasedSharesOfADeadProcessGoBack: three processes hold shares of
// GCRA 150/s (burst 15, leases of 300 ms), each asking 100 times a second;
// one dies (its client closes mid-lease, nothing given back). Its share
// runs out at its lease's end and the other two take the rate: from two
// leases after the death they admit at least leaseUseWithin of 150/s, and
// the fleet never more than the envelope.
func TestLeasedSharesOfADeadProcessGoBack(t *testing.T) {
	const lease = 300 * time.Millisecond
	tg := redistest.New(t)
	policy := throttle.GCRA{Rate: throttle.PerSecond(150), Burst: 15}
	var ls []*throttle.Limiter
	var dying interface{ Close() error }
	for i := range 3 {
		client := tg.NewClient(t)
		l, err := throttle.New(client, "dead", policy, throttle.WithPrefix(tg.Prefix), throttle.WithLeasedShares(lease), throttle.WithLogger(nil))
		if err != nil {
			t.Fatal(err)
		}
		if i == 2 {
			dying = client // its Close, at the end, gives back nothing: its client is gone
		}
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		ls = append(ls, l)
	}
	offset := redistest.ClockOffset(t, tg.NewClient(t))
	start := time.Now()
	died := start.Add(1500 * time.Millisecond)
	var early []admission
	done := make(chan struct{})
	go func() {
		defer close(done)
		early, _ = hammerLeased(t, ls[2:], "k", time.Second/100, died, offset)
		_ = dying.Close() // dies: no renewal, no Close of its limiter
	}()
	rest, _ := hammerLeased(t, ls[:2], "k", time.Second/100, start.Add(4*time.Second), offset)
	<-done
	all := append(append([]admission(nil), early...), rest...)
	sortAdmissions(all)
	var after int
	from := died.Add(2 * lease)
	for _, a := range rest {
		if a.at.After(from) {
			after++
		}
	}
	rate := float64(after) / start.Add(4*time.Second).Sub(from).Seconds()
	excess := worstExcess(all, 150)
	t.Logf("figures: %s: from two leases after a holder died, the other two admitted %.1f/s (policy 150/s); most beyond the rate in any span %.2f (burst 15)",
		tg.Kind, rate, excess)
	if excess > 15+leaseClockAllowance {
		t.Errorf("%.2f admitted beyond 150/s in a span; the burst is 15", excess)
	}
	if rate < leaseUseWithin*150 {
		t.Errorf("%.1f/s admitted from two leases after the death, want at least %.0f%% of 150/s", rate, 100*leaseUseWithin)
	}
}
