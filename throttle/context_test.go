package throttle_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// promptness is how soon after its context ends a call must return: the
// library's promise.
const promptness = 50 * time.Millisecond

// hungRedis returns a client with go-redis's default options (3 s reads,
// retried three times) to a Redis that answers until hang is called, and
// then holds every byte: a server that hangs without closing connections.
func hungRedis(t *testing.T) (client *redis.Client, hang func()) {
	t.Helper()
	_, proxy, client := redistest.Hangable(t)
	return client, proxy.Pause
}

// returnsPromptly runs call with a context that ends after d (by its
// deadline, or cancelled) and fails the test unless call returns within
// promptness of that, with the context's error.
//
// The lateness is counted from the moment a goroutine of the test saw the
// context end, not from when the test's timer was due: on a busy machine
// the timer that cancels or expires the context fires late by itself (CI
// once measured a cancel 57 ms late from the timer's due time), and that is
// the machine's delay, not the call's.
func returnsPromptly(t *testing.T, name string, d time.Duration, call func(ctx context.Context) error) {
	t.Helper()
	for _, how := range []string{"deadline", "cancel"} {
		ctx, cancel := context.WithCancel(context.Background())
		if how == "deadline" {
			cancel()
			ctx, cancel = context.WithTimeout(context.Background(), d)
		} else {
			time.AfterFunc(d, cancel)
		}
		seen := make(chan time.Time, 1)
		context.AfterFunc(ctx, func() { seen <- time.Now() })
		err := call(ctx)
		returned := time.Now()
		cancel()
		late := returned.Sub(<-seen)
		if late > promptness {
			t.Errorf("%s (%s): returned %s after its context ended; the promise is %s", name, how, late.Round(time.Millisecond), promptness)
		}
		want := context.DeadlineExceeded
		if how == "cancel" {
			want = context.Canceled
		}
		if !errors.Is(err, want) {
			t.Errorf("%s (%s): %v; want an error wrapping %v", name, how, err, want)
		}
	}
}

// TestCallsReturnWhenTheirContextEnds: with Redis hanging and a client on
// go-redis's defaults (which apply no context to its reads and retry them,
// 5 to 10 s before it gives up), every call returns within 50 ms of its
// context ending, including the clean-up a call does on its way out (a
// cancelled Wait gives its booking back, Release frees its slot), which
// goes on in the background.
func TestCallsReturnWhenTheirContextEnds(t *testing.T) {
	client, hang := hungRedis(t)
	ctx := context.Background()
	gcra, err := throttle.New(client, "gcra", throttle.GCRA{Rate: throttle.PerSecond(1), Burst: 1})
	if err != nil {
		t.Fatal(err)
	}
	window, err := throttle.New(client, "window", throttle.FixedWindow{Limit: 1, Window: redistest.FarWindow}, throttle.WithCoalescing(0))
	if err != nil {
		t.Fatal(err)
	}
	conc, err := throttle.NewConcurrencyLimiter(client, "conc", throttle.Concurrency{Limit: 5, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// Taken while Redis answers: a booking 10 s out to wait for, one to
	// cancel, and leases to release.
	for range 2 {
		if _, err := gcra.Allow(ctx, "busy"); err != nil {
			t.Fatal(err)
		}
	}
	slow, err := throttle.New(client, "slow", throttle.GCRA{Rate: throttle.PerHour(1), Burst: 1})
	if err != nil {
		t.Fatal(err)
	}
	var booked []*throttle.Reservation
	for range 5 {
		res, err := slow.Reserve(ctx, "booked", 1, 24*time.Hour)
		if err != nil || !res.OK {
			t.Fatalf("Reserve: %+v, %v", res, err)
		}
		booked = append(booked, res)
	}
	var leases []*throttle.Lease
	for range 2 {
		lease, _, err := conc.Acquire(ctx, "held")
		if err != nil || lease == nil {
			t.Fatalf("Acquire: %v, %v", lease, err)
		}
		leases = append(leases, lease)
	}
	store, err := throttle.NewPolicyStore(client, "")
	if err != nil {
		t.Fatal(err)
	}
	hang()

	const d = 100 * time.Millisecond
	for _, c := range []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"Allow", func(ctx context.Context) error { _, err := gcra.Allow(ctx, "k"); return err }},
		{"Allow uncoalesced", func(ctx context.Context) error { _, err := window.Allow(ctx, "k"); return err }},
		{"Peek", func(ctx context.Context) error { _, err := gcra.Peek(ctx, "k"); return err }},
		{"AllowMany", func(ctx context.Context) error {
			_, err := gcra.AllowMany(ctx, []throttle.Request{{Key: "a", N: 1}, {Key: "b", N: 1}})
			return err
		}},
		{"Reset", func(ctx context.Context) error { return gcra.Reset(ctx, "k") }},
		{"BlockFor", func(ctx context.Context) error { return gcra.BlockFor(ctx, "k", time.Second) }},
		{"BlockedFor", func(ctx context.Context) error { _, err := gcra.BlockedFor(ctx, "k"); return err }},
		{"Reserve", func(ctx context.Context) error { _, err := gcra.Reserve(ctx, "k", 1, time.Minute); return err }},
		{"Wait", func(ctx context.Context) error { return gcra.Wait(ctx, "k") }},
		{"Wait on a window", func(ctx context.Context) error { return window.Wait(ctx, "k") }},
		{"Acquire", func(ctx context.Context) error { _, _, err := conc.Acquire(ctx, "k"); return err }},
		{"ConcurrencyLimiter.Peek", func(ctx context.Context) error { _, err := conc.Peek(ctx, "k"); return err }},
		{"PolicyStore.Set", func(ctx context.Context) error {
			return store.Set(ctx, "n", throttle.GCRA{Rate: throttle.PerSecond(1), Burst: 1})
		}},
		{"PolicyStore.Replace", func(ctx context.Context) error {
			return store.Replace(ctx, "n", throttle.GCRA{Rate: throttle.PerSecond(1), Burst: 1})
		}},
		{"PolicyStore.Unset", func(ctx context.Context) error { return store.Unset(ctx, "n") }},
		{"PolicyStore.Get", func(ctx context.Context) error { _, err := store.Get(ctx, "n"); return err }},
	} {
		returnsPromptly(t, c.name, d, c.call)
	}
	// Clean-up on the way out: a booked slot's Wait, cut short, gives the
	// booking back; Cancel and Release give back on their own.
	next := func() *throttle.Reservation {
		res := booked[len(booked)-1]
		booked = booked[:len(booked)-1]
		return res
	}
	returnsPromptly(t, "Reservation.Wait", d, func(ctx context.Context) error { return next().Wait(ctx) })
	returnsPromptly(t, "Reservation.Cancel", d, func(ctx context.Context) error { return next().Cancel(ctx) })
	returnsPromptly(t, "Lease.Release", d, func(ctx context.Context) error {
		lease := leases[0]
		leases = leases[1:]
		return lease.Release(ctx)
	})
}

// TestReleaseBehindAStuckRenewal: a lease whose renewal is stuck on a
// hanging Redis is released within its caller's deadline, not after the
// client's timeouts.
func TestReleaseBehindAStuckRenewal(t *testing.T) {
	client, hang := hungRedis(t)
	conc, err := throttle.NewConcurrencyLimiter(client, "conc", throttle.Concurrency{Limit: 2, Lease: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var leases []*throttle.Lease
	for range 2 {
		lease, _, err := conc.Acquire(context.Background(), "k")
		if err != nil || lease == nil {
			t.Fatalf("Acquire: %v, %v", lease, err)
		}
		leases = append(leases, lease)
	}
	hang()
	time.Sleep(conc.Policy().Heartbeat() + 100*time.Millisecond) // renewals are on their way, stuck
	returnsPromptly(t, "Release", 100*time.Millisecond, func(ctx context.Context) error {
		lease := leases[0]
		leases = leases[1:]
		return lease.Release(ctx)
	})
}

// TestLostWhenRedisStopsAnswering: a lease of 300 ms is reported lost no
// later than 300 ms after its last good renewal, however long the client
// would wait on its own, and never earlier than Redis could drop it.
func TestLostWhenRedisStopsAnswering(t *testing.T) {
	client, hang := hungRedis(t)
	const lease = 300 * time.Millisecond
	conc, err := throttle.NewConcurrencyLimiter(client, "conc", throttle.Concurrency{Limit: 1, Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	l, _, err := conc.Acquire(context.Background(), "k")
	if err != nil || l == nil {
		t.Fatalf("Acquire: %v, %v", l, err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_ = l.Release(ctx)
	}()
	time.Sleep(250 * time.Millisecond) // a renewal or two went through
	hung := time.Now()
	hang()
	select {
	case <-l.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("Lost not closed 5 s after Redis stopped answering, for a 300 ms lease")
	}
	after := time.Since(hung)
	// The last good renewal was sent at most a heartbeat before the hang,
	// so the lease runs out in Redis between lease - heartbeat and lease
	// after it: Lost must be closed by then.
	if after > lease+promptness {
		t.Fatalf("Lost closed %s after Redis stopped answering, for a %s lease", after.Round(time.Millisecond), lease)
	}
	t.Logf("figures: Lost closed %s after Redis stopped answering (lease %s, heartbeat %s)",
		after.Round(time.Millisecond), lease, conc.Policy().Heartbeat())
}

// TestReleaseDoesNotCloseLost: a lease released while held is not lost.
//
// The lease is 900 ms (a renewal every 300 ms) so that a renewal delayed by
// a busy machine cannot let it run out: CI once saw a 150 ms lease lapse
// when its 50 ms renewals stalled for over 100 ms under -race and two lanes.
func TestReleaseDoesNotCloseLost(t *testing.T) {
	tg := redistest.New(t)
	conc, err := throttle.NewConcurrencyLimiter(tg.Client, "conc", throttle.Concurrency{Limit: 1, Lease: 900 * time.Millisecond}, throttle.WithPrefix(tg.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		l, _, err := conc.Acquire(context.Background(), "k")
		if err != nil || l == nil {
			t.Fatalf("Acquire %d: %v, %v", i, l, err)
		}
		time.Sleep(time.Duration(i) * conc.Policy().Heartbeat() / 3) // release mid-renewal, now and then
		if err := l.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		select {
		case <-l.Lost():
			t.Fatalf("release %d closed Lost", i)
		case <-time.After(conc.Policy().Heartbeat()):
		}
	}
}
