package throttle_test

import (
	"context"
	"errors"
	"math/big"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// commandCounter counts the commands a client sends, by name.
type commandCounter struct {
	mu        sync.Mutex
	count     map[string]int
	pipelines atomic.Int32
	noscript  atomic.Int32 // script calls in pipelines that Redis answered NOSCRIPT
}

func (c *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		// A connection's set-up (HELLO, CLIENT SETINFO) is not the
		// library's: a second connection is opened whenever a background
		// write (the registry of names) holds the first.
		if name := cmd.Name(); name != "hello" && name != "client" {
			c.mu.Lock()
			c.count[name]++
			c.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

func (c *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && (cmds[0].Name() == "evalsha" || cmds[0].Name() == "eval") {
			c.pipelines.Add(1) // not the connection's own set-up
		}
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
				c.noscript.Add(1)
			}
		}
		return err
	}
}

func (c *commandCounter) total() (n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, v := range c.count {
		n += v
	}
	return n
}

// TestReserveStaggersSlots: 1,000 reservations at 50/s from four goroutines
// on two connection pools get 1,000 distinct start times, exactly one
// emission interval apart (none earlier than the policy allows), the last
// 19.98 s after the first; each costs one script call, and the limiter
// counts every booked slot as taken.
func TestReserveStaggersSlots(t *testing.T) {
	for _, p := range []throttle.Policy{
		throttle.GCRA{Rate: throttle.PerSecond(50), Burst: 1},
		throttle.TokenBucket{Rate: throttle.PerSecond(50), Burst: 1},
	} {
		t.Run(describe(p), func(t *testing.T) {
			tg := redistest.New(t)
			counter := &commandCounter{count: map[string]int{}}
			var limiters []*throttle.Limiter
			for range 2 {
				c := tg.NewClient(t)
				c.AddHook(counter)
				l, err := throttle.New(c, "l", p, throttle.WithPrefix(tg.Prefix))
				if err != nil {
					t.Fatal(err)
				}
				limiters = append(limiters, l)
			}
			const total, workers = 1000, 4
			starts := make(chan int64, total)
			var wg sync.WaitGroup
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range total / workers {
						res, err := limiters[w%2].Reserve(context.Background(), "batch", 1, time.Minute)
						if err != nil || !res.OK {
							t.Errorf("Reserve: %+v, %v", res, err)
							return
						}
						starts <- throttle.ServerStart(res)
					}
				}()
			}
			wg.Wait()
			close(starts)
			var sorted []int64
			for s := range starts {
				sorted = append(sorted, s)
			}
			sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
			if len(sorted) != total {
				t.Fatalf("%d reservations booked, want %d", len(sorted), total)
			}
			const interval = 20_000 // µs at 50/s
			for i, s := range sorted {
				if want := sorted[0] + int64(i)*interval; s != want {
					t.Fatalf("slot %d starts at %d µs, want %d (first + %d × 20 ms)", i, s, want, i)
				}
			}
			if last := time.Duration(sorted[total-1]-sorted[0]) * time.Microsecond; last != 19980*time.Millisecond {
				t.Fatalf("the last slot starts %s after the first, want 19.98s", last)
			}
			// One EVALSHA per reservation; the first callers on a server that
			// has not seen the script yet fall back to EVAL once (NOSCRIPT).
			// Connection set-up (HELLO, CLIENT SETINFO) aside, nothing else.
			scripts := counter.count["evalsha"] + counter.count["eval"]
			setup := counter.count["hello"] + counter.count["client"]
			if counter.count["evalsha"] != total || counter.count["eval"] > workers || counter.total()-setup != scripts {
				t.Fatalf("commands sent: %v; want one script call per reservation", counter.count)
			}
			// Every booked slot is taken: a caller who did not reserve is
			// admitted only after the last one.
			r := peek(t, limiters[0], "batch")
			if lastEnd := sorted[total-1] + interval; r.Allowed || throttle.ServerTime(r)+r.RetryAfter.Microseconds() != lastEnd {
				t.Fatalf("after the reservations Peek says %+v; want rejected until %d µs", r, lastEnd)
			}
		})
	}
}

func TestReserveWithBurstAndLimits(t *testing.T) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	l := newLimiter(t, tg, throttle.TokenBucket{Rate: throttle.PerSecond(10), Burst: 3})
	ctx := context.Background()
	var delays []time.Duration
	for range 5 {
		res, err := l.Reserve(ctx, "k", 1, time.Second)
		if err != nil || !res.OK {
			t.Fatalf("Reserve: %+v, %v", res, err)
		}
		delays = append(delays, res.Delay)
	}
	want := []time.Duration{0, 0, 0, 100 * time.Millisecond, 200 * time.Millisecond}
	for i := range want {
		if delays[i] != want[i] {
			t.Fatalf("delays %v, want %v: the burst at once, then one every 100ms", delays, want)
		}
	}
	// The next slot would start in 300ms; with at most 250ms accepted,
	// nothing is booked and RetryAfter says how much longer it is.
	before := peek(t, l, "k")
	res, err := l.Reserve(ctx, "k", 1, 250*time.Millisecond)
	if err != nil || res.OK || res.RetryAfter != 50*time.Millisecond || !res.StartAt.IsZero() {
		t.Fatalf("Reserve beyond maxDelay: %+v, %v; want not booked, RetryAfter 50ms", res, err)
	}
	if after := peek(t, l, "k"); after != before {
		t.Fatalf("a refused reservation changed the state: %+v, then %+v", before, after)
	}
	if err := res.Wait(ctx); !errors.Is(err, throttle.ErrNotReserved) {
		t.Fatalf("Wait on a refused reservation: %v", err)
	}
	// Time passes; the debt is paid off at the rate.
	clock.Advance(300 * time.Millisecond)
	if r := allowN(t, l, "k", 1); !r.Allowed {
		t.Fatalf("after the booked slots: %+v", r)
	}
}

func TestReserveBadRequests(t *testing.T) {
	tg := redistest.Embedded(t)
	ctx := context.Background()
	for _, a := range algorithms() {
		l := newLimiter(t, tg, a.policy)
		_, err := l.Reserve(ctx, "k", 1, time.Second)
		switch a.name {
		case "TokenBucket", "GCRA":
			if err != nil {
				t.Errorf("%s: Reserve: %v", a.name, err)
			}
			for _, tc := range []struct {
				key   string
				n     int
				delay time.Duration
				want  error
			}{
				{"", 1, time.Second, throttle.ErrInvalidKey},
				{"k", 0, time.Second, throttle.ErrInvalidN},
				{"k", 6, time.Second, throttle.ErrExceedsLimit},
				{"k", 1, -time.Nanosecond, throttle.ErrInvalidDelay},
			} {
				if _, err := l.Reserve(ctx, tc.key, tc.n, tc.delay); !errors.Is(err, tc.want) {
					t.Errorf("%s: Reserve(%q, %d, %s) = %v, want %v", a.name, tc.key, tc.n, tc.delay, err, tc.want)
				}
			}
		default:
			if !errors.Is(err, throttle.ErrNotSupported) {
				t.Errorf("%s: Reserve = %v, want ErrNotSupported", a.name, err)
			}
		}
	}
}

func TestCancelGivesBackWhatItCan(t *testing.T) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	l := newLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1})
	ctx := context.Background()
	reserve := func() *throttle.Reservation {
		t.Helper()
		res, err := l.Reserve(ctx, "k", 1, time.Minute)
		if err != nil || !res.OK {
			t.Fatalf("Reserve: %+v, %v", res, err)
		}
		return res
	}
	now := reserve() // starts now
	middle := reserve()
	last := reserve()
	// The last booking gives its slot back whole: the next one takes it.
	if err := last.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	if err := last.Cancel(ctx); err != nil {
		t.Fatalf("second Cancel: %v", err)
	}
	again := reserve()
	if again.Delay != last.Delay {
		t.Fatalf("after cancelling the last slot (%s) the next booking got %s", last.Delay, again.Delay)
	}
	// A booking with another behind it gives nothing back: no slot moves.
	if err := middle.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	if next := reserve(); next.Delay != 300*time.Millisecond {
		t.Fatalf("after cancelling a middle slot the next booking got %s, want 300ms", next.Delay)
	}
	// The first booking has three standing on it: nothing to give back.
	if err := now.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	clock.Advance(50 * time.Millisecond)
	if next := reserve(); next.Delay != 350*time.Millisecond {
		t.Fatalf("after cancelling the first slot the next booking got %s, want 350ms", next.Delay)
	}

	// An immediate booking with nothing after it is given back whole, even
	// though its slot has begun: the caller says it did not use it.
	other := newLimiter(t, tg, throttle.TokenBucket{Rate: throttle.PerSecond(10), Burst: 2})
	first, err := other.Reserve(ctx, "k", 2, 0)
	if err != nil || !first.OK || first.Delay != 0 {
		t.Fatalf("Reserve: %+v, %v", first, err)
	}
	clock.Advance(10 * time.Millisecond)
	if err := first.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	if r := peek(t, other, "k"); r.Remaining != 2 {
		t.Fatalf("after cancelling an unused immediate booking: %+v, want the bucket full", r)
	}
}

// TestReservationsAgreeWithModel walks random takes, reservations and
// cancellations through TokenBucket and GCRA and the GCRA reference model.
func TestReservationsAgreeWithModel(t *testing.T) {
	for _, p := range []struct {
		rate  throttle.Rate
		burst int
	}{
		{throttle.Rate{N: 3, Per: time.Second}, 4},
		{throttle.PerSecond(50), 1},
		{throttle.Rate{N: 7, Per: 1500 * time.Microsecond}, 13},
	} {
		for _, policy := range []throttle.Policy{throttle.GCRA{Rate: p.rate, Burst: p.burst}, throttle.TokenBucket{Rate: p.rate, Burst: p.burst}} {
			t.Run(describe(policy), func(t *testing.T) {
				tg := redistest.Embedded(t)
				clock := tg.Clock(t)
				l := newLimiter(t, tg, policy)
				m := newGCRAModel(p.rate.N, p.rate.Per, p.burst).(*gcraModel)
				interval := p.rate.Per.Microseconds() / int64(p.rate.N)
				rng := rand.New(rand.NewPCG(5, uint64(p.burst)))
				type booking struct {
					res *throttle.Reservation
					n   int64
					end *big.Rat
				}
				var open []booking
				var booked, refused int
				for i := range 600 {
					clock.Advance(time.Duration(rng.Int64N(interval*int64(p.burst)+1)) * time.Microsecond)
					now := clock.Now().UnixMicro()
					n := 1 + rng.IntN(p.burst)
					switch op := rng.IntN(10); {
					case op < 5:
						maxWait := rng.Int64N(interval * int64(p.burst))
						res, err := l.Reserve(context.Background(), "k", n, time.Duration(maxWait)*time.Microsecond)
						if err != nil {
							t.Fatal(err)
						}
						got := decision{res.OK, int64(res.Remaining), res.Delay.Microseconds() + res.RetryAfter.Microseconds(), -1}
						want, end := m.reserve(now, int64(n), maxWait)
						want.ResetAfter = -1
						if got != want {
							t.Fatalf("step %d: Reserve(n=%d, max %dµs): %+v, model %+v", i, n, maxWait, got, want)
						}
						if res.OK {
							booked++
							open = append(open, booking{res, int64(n), end})
						} else {
							refused++
						}
					case op < 7 && len(open) > 0:
						j := rng.IntN(len(open))
						if err := open[j].res.Cancel(context.Background()); err != nil {
							t.Fatal(err)
						}
						m.cancel(now, open[j].n, open[j].end)
						open = append(open[:j], open[j+1:]...)
					default:
						checkAgainstModel(t, l, m, "k", n, true, "step "+itoa(i))
					}
				}
				if booked < 50 || refused < 10 {
					t.Fatalf("%d booked, %d refused: the walk did not exercise both", booked, refused)
				}
			})
		}
	}
}

// TestWaitOnAMeterIsOneCallPerWaiter: waiters on one key each book a slot
// and sleep until it; none polls Redis again.
func TestWaitOnAMeterIsOneCallPerWaiter(t *testing.T) {
	tg := redistest.New(t)
	counter := &commandCounter{count: map[string]int{}}
	c := tg.NewClient(t)
	c.AddHook(counter)
	l, err := throttle.New(c, "l", throttle.GCRA{Rate: throttle.PerSecond(40), Burst: 1}, throttle.WithPrefix(tg.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	const waiters = 12
	elapsed := waitConcurrently(t, l, waiters)
	// Slots are 25ms apart on the Redis clock: the last cannot start sooner.
	if least := (waiters - 1) * 25 * time.Millisecond; elapsed < least {
		t.Fatalf("%d waiters done in %s, sooner than the policy allows (%s)", waiters, elapsed, least)
	}
	if calls := counter.count["evalsha"]; calls != waiters || counter.count["eval"] > waiters {
		t.Fatalf("%d script calls for %d waiters: %v", calls, waiters, counter.count)
	}
}

func TestWaitOnAWindowPollsUntilAdmitted(t *testing.T) {
	tg := redistest.New(t)
	l := newLimiter(t, tg, throttle.FixedWindow{Limit: 2, Window: 100 * time.Millisecond})
	// 5 waiters, 2 per window: the last is admitted after two boundaries,
	// which are a full window apart.
	if elapsed := waitConcurrently(t, l, 5); elapsed < 100*time.Millisecond {
		t.Fatalf("5 waiters on 2 per 100ms done in %s", elapsed)
	}
}

// waitConcurrently starts waiters goroutines calling Wait on one key, fails
// the test unless every one is admitted, and returns how long that took.
func waitConcurrently(t *testing.T, l *throttle.Limiter, waiters int) time.Duration {
	t.Helper()
	start := time.Now()
	var wg sync.WaitGroup
	var done atomic.Int32
	for range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := l.Wait(context.Background(), "k"); err != nil {
				t.Error(err)
				return
			}
			done.Add(1)
		}()
	}
	wg.Wait()
	if int(done.Load()) != waiters {
		t.Fatalf("%d of %d waiters admitted", done.Load(), waiters)
	}
	return time.Since(start)
}

// TestWaitRefusesADeadlineItCannotMeet: when the wait would pass the
// context's deadline, Wait returns at once, consuming nothing.
func TestWaitRefusesADeadlineItCannotMeet(t *testing.T) {
	for _, a := range algorithmsWith(2, time.Hour, throttle.PerHour(2)) {
		t.Run(a.name, func(t *testing.T) {
			tg := redistest.New(t)
			l := newLimiter(t, tg, a.policy)
			allowN(t, l, "k", 2)
			before := peek(t, l, "k")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			err := l.Wait(ctx, "k")
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Wait for a slot an hour away with a 10s deadline: %v", err)
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Fatalf("Wait took %s to give up; it should not sleep in vain", took)
			}
			after := peek(t, l, "k")
			if after.Remaining != before.Remaining || after.RetryAfter > before.RetryAfter {
				t.Fatalf("the refused wait consumed capacity: %+v, then %+v", before, after)
			}
		})
	}
}

// TestWaitReturnsPromptlyOnCancel: a cancelled waiter returns at once with
// context.Canceled, and its booked slot is given back.
func TestWaitReturnsPromptlyOnCancel(t *testing.T) {
	for _, a := range algorithmsWith(1, 10*time.Second, throttle.Rate{N: 1, Per: 10 * time.Second}) {
		t.Run(a.name, func(t *testing.T) {
			tg := redistest.New(t)
			l := newLimiter(t, tg, a.policy)
			allowN(t, l, "k", 1)
			before := peek(t, l, "k")
			if before.RetryAfter < time.Second {
				// A fixed window turning over within the test would admit
				// the waiter (CI saw it once): take the next window's unit.
				time.Sleep(before.RetryAfter + 50*time.Millisecond)
				allowN(t, l, "k", 1)
				before = peek(t, l, "k")
			}
			ctx, cancel := context.WithCancel(context.Background())
			errs := make(chan error, 1)
			go func() { errs <- l.Wait(ctx, "k") }()
			time.Sleep(50 * time.Millisecond)
			cancelled := time.Now()
			cancel()
			select {
			case err := <-errs:
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("cancelled Wait: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Wait did not return within 5s of cancellation")
			}
			if took := time.Since(cancelled); took > 2*time.Second {
				t.Fatalf("Wait returned %s after cancellation", took)
			}
			// Only the first unit remains taken: the waiter's booking (on the
			// meters that book) is given back, in the background once Wait
			// has returned.
			deadline := time.Now().Add(2 * time.Second)
			for r := peek(t, l, "k"); r.RetryAfter > before.RetryAfter; r = peek(t, l, "k") {
				if time.Now().After(deadline) {
					t.Fatalf("before the wait %+v, 2 s after its cancellation %+v: the waiter's slot is still booked", before, r)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// answerHold holds every script call's answer, once Redis has run it
// (NOSCRIPT answers pass), until released: a caller whose context ends meanwhile has had its call
// done by Redis without learning the answer.
type answerHold struct {
	answered chan struct{} // a token per held answer
	released chan struct{}
}

func (h *answerHold) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *answerHold) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil && (cmd.Name() == "evalsha" || cmd.Name() == "eval") {
			h.answered <- struct{}{}
			<-h.released
		}
		return err
	}
}
func (h *answerHold) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestWaitCancelledMidCallGivesTheSlotBack: a Wait or Reserve cancelled
// after Redis booked its slot but before the answer reached it returns at
// once with the context's error, and the slot is given back as soon as
// the answer comes.
func TestWaitCancelledMidCallGivesTheSlotBack(t *testing.T) {
	calls := map[string]func(context.Context, *throttle.Limiter) error{
		"Wait": func(ctx context.Context, l *throttle.Limiter) error { return l.Wait(ctx, "k") },
		"Reserve": func(ctx context.Context, l *throttle.Limiter) error {
			_, err := l.Reserve(ctx, "k", 1, time.Minute)
			return err
		},
	}
	for _, p := range []throttle.Policy{
		throttle.TokenBucket{Rate: throttle.Rate{N: 1, Per: 10 * time.Second}, Burst: 1},
		throttle.GCRA{Rate: throttle.Rate{N: 1, Per: 10 * time.Second}, Burst: 1},
	} {
		for name, call := range calls {
			t.Run(name+" "+describe(p), func(t *testing.T) { cancelledMidCall(t, p, call) })
		}
	}
}

// cancelledMidCall runs one case of TestWaitCancelledMidCallGivesTheSlotBack:
// call, on a limiter of p whose script answers are held, cancelled once
// Redis has booked.
func cancelledMidCall(t *testing.T, p throttle.Policy, call func(context.Context, *throttle.Limiter) error) {
	t.Helper()
	tg := redistest.New(t)
	plain := newLimiter(t, tg, p)
	h := &answerHold{answered: make(chan struct{}, 10), released: make(chan struct{})}
	held := tg.NewClient(t)
	held.AddHook(h)
	l, err := throttle.New(held, policyName(p), p, throttle.WithPrefix(tg.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	allowN(t, plain, "k", 1)
	before := peek(t, plain, "k")
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 1)
	go func() { errs <- call(ctx, l) }()
	<-h.answered // booked by Redis; the answer is held
	cancel()
	if err := <-errs; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled mid-call: %v; want context.Canceled", err)
	}
	if r := peek(t, plain, "k"); r.RetryAfter <= before.RetryAfter {
		t.Fatalf("after the booking %+v, before it %+v: want the slot booked while its answer is held", r, before)
	}
	close(h.released)
	deadline := time.Now().Add(3 * time.Second)
	for r := peek(t, plain, "k"); r.RetryAfter > before.RetryAfter; r = peek(t, plain, "k") {
		if time.Now().After(deadline) {
			t.Fatalf("before the wait %+v, 3 s after its answer came %+v: the slot is still booked", before, r)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
