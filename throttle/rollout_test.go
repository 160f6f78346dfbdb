package throttle_test

import (
	"context"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// change is one policy change under one limiter name: the policy before,
// the policy after, and the capacity of the larger one. In each, one
// policy allows at least what the other does (a rate and a capacity no
// smaller, a window no longer): "the larger policy".
type change struct {
	name     string
	old, new throttle.Policy
	larger   int
}

func changes() []change {
	rate := func(n int) throttle.Rate { return throttle.Rate{N: n, Per: time.Second} }
	return []change{
		{"GCRA", throttle.GCRA{Rate: rate(10), Burst: 10}, throttle.GCRA{Rate: rate(5), Burst: 5}, 10},
		{"GCRA-odd-interval", throttle.GCRA{Rate: rate(3), Burst: 4}, throttle.GCRA{Rate: rate(7), Burst: 7}, 7},
		{"TokenBucket", throttle.TokenBucket{Rate: rate(5), Burst: 5}, throttle.TokenBucket{Rate: rate(20), Burst: 20}, 20},
		{"LeakyBucket", throttle.LeakyBucket{Rate: rate(10), Capacity: 10}, throttle.LeakyBucket{Rate: rate(3), Capacity: 6}, 10},
		{"FixedWindow", throttle.FixedWindow{Limit: 10, Window: time.Second}, throttle.FixedWindow{Limit: 5, Window: time.Second}, 10},
		{"FixedWindow-shorter", throttle.FixedWindow{Limit: 10, Window: time.Minute}, throttle.FixedWindow{Limit: 20, Window: time.Second}, 20},
		{"SlidingLog", throttle.SlidingLog{Limit: 5, Window: time.Second}, throttle.SlidingLog{Limit: 10, Window: time.Second}, 10},
		{"SlidingWindow", throttle.SlidingWindow{Limit: 10, Window: time.Second}, throttle.SlidingWindow{Limit: 5, Window: time.Second}, 10},
		{"SlidingWindow-shorter", throttle.SlidingWindow{Limit: 5, Window: time.Minute}, throttle.SlidingWindow{Limit: 10, Window: time.Second}, 10},
		{"Quota", throttle.Quota{Limit: 10, Period: throttle.Day}, throttle.Quota{Limit: 20, Period: throttle.Day}, 20},
	}
}

// drain takes units from l for key until it rejects one, and returns how
// many it admitted.
func drain(t *testing.T, l *throttle.Limiter, key string) int {
	t.Helper()
	admitted := 0
	for admitted <= 1000 {
		if !allowN(t, l, key, 1).Allowed {
			return admitted
		}
		admitted++
	}
	t.Fatalf("%q admitted more than 1000 units at one instant", key)
	return admitted
}

// TestPolicyChangeKeepsWhatWasConsumed: two limiters of one name and two
// policies, at one instant on the Redis clock. Whichever decides first, the
// two together admit what the larger policy allows, never the sum (before
// names, GCRA 10/s burst 10 and 5/s burst 5 admitted 15), and what the old
// policy consumed counts for the new one.
func TestPolicyChangeKeepsWhatWasConsumed(t *testing.T) {
	for _, c := range changes() {
		t.Run(c.name, func(t *testing.T) {
			for _, order := range []string{"old first", "new first"} {
				tg := redistest.Embedded(t)
				tg.Clock(t)
				old := newNamedLimiter(t, tg, "partner-api", c.old)
				next := newNamedLimiter(t, tg, "partner-api", c.new)
				first, second := old, next
				if order == "new first" {
					first, second = next, old
				}
				got := drain(t, first, "tenant-1") + drain(t, second, "tenant-1")
				if got != c.larger {
					t.Errorf("%s: admitted %d at one instant, want %d (the larger policy's capacity)", order, got, c.larger)
				}
			}

			// Consumed under the old policy, counted by the new one.
			tg := redistest.Embedded(t)
			tg.Clock(t)
			old := newNamedLimiter(t, tg, "partner-api", c.old)
			next := newNamedLimiter(t, tg, "partner-api", c.new)
			took := 3
			for range took {
				if !allowN(t, old, "tenant-1", 1).Allowed {
					t.Fatal("the old policy rejected one of its first units")
				}
			}
			r := peek(t, next, "tenant-1")
			if want := max(0, r.Limit-took); r.Remaining != want {
				t.Errorf("after %d units under the old policy the new one has %d remaining, want %d of %d", took, r.Remaining, want, r.Limit)
			}
		})
	}
}

// TestRolloutNeverAdmitsMoreThanTheLargerPolicy: half the callers run the
// old policy and half the new one on the same name and key, concurrently,
// for a while on the real clock. The admissions, at their slots as Redis
// decided them, never exceed what the larger policy allows in any window.
func TestRolloutNeverAdmitsMoreThanTheLargerPolicy(t *testing.T) {
	redistest.QuietRedisLog() // callers cut short by the deadline
	for _, c := range changes() {
		t.Run(c.name, func(t *testing.T) {
			tg := redistest.New(t)
			var mu sync.Mutex
			var slots []time.Time
			observer := throttle.ObserverFunc(func(_ context.Context, d throttle.Decision) {
				if d.Outcome == throttle.Admitted {
					mu.Lock()
					slots = append(slots, d.Slot)
					mu.Unlock()
				}
			})
			old := newNamedLimiter(t, tg, "rollout", c.old, throttle.WithObserver(observer))
			next := newNamedLimiter(t, tg, "rollout", c.new, throttle.WithObserver(observer))
			ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
			defer cancel()
			var wg sync.WaitGroup
			for i := range 6 {
				l := old
				if i%2 == 1 {
					l = next
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					for ctx.Err() == nil {
						if _, err := l.Allow(ctx, "tenant-1"); err != nil && ctx.Err() == nil {
							t.Errorf("Allow: %v", err)
							return
						}
					}
				}()
			}
			wg.Wait()
			sort.Slice(slots, func(i, j int) bool { return slots[i].Before(slots[j]) })
			if len(slots) < c.larger {
				t.Fatalf("admitted %d, fewer than one burst (%d): the test proves nothing", len(slots), c.larger)
			}
			checkLarger(t, c, slots)
		})
	}
}

// checkLarger checks admissions at slots against the larger policy of c.
func checkLarger(t *testing.T, c change, slots []time.Time) {
	t.Helper()
	switch p := larger(c).(type) {
	case throttle.GCRA, throttle.TokenBucket, throttle.LeakyBucket:
		rate, burst := meterOf(p)
		interval := rate.Per / time.Duration(rate.N)
		for i := range slots {
			for j := i; j < len(slots); j++ {
				allowed := burst + int(slots[j].Sub(slots[i])/interval)
				if j-i+1 > allowed {
					t.Fatalf("%d admitted from %s to %s (%s), the larger policy %#v allows %d",
						j-i+1, slots[i].Format(time.StampMicro), slots[j].Format(time.StampMicro), slots[j].Sub(slots[i]), p, allowed)
				}
			}
		}
	case throttle.FixedWindow, throttle.SlidingWindow:
		limit, window := countOf(p)
		per := map[int64]int{}
		for _, s := range slots {
			per[s.UnixMicro()/window.Microseconds()]++
		}
		for w, n := range per {
			if n > limit {
				t.Fatalf("%d admitted in window %d, the larger policy %#v allows %d", n, w, p, limit)
			}
		}
	case throttle.Quota:
		per := map[string]int{}
		for _, s := range slots {
			per[s.UTC().Format(time.DateOnly)]++
		}
		for day, n := range per {
			if n > p.Limit {
				t.Fatalf("%d admitted on %s, the larger policy %v allows %d", n, day, p, p.Limit)
			}
		}
	case throttle.SlidingLog:
		for i := range slots {
			j := i
			for j < len(slots) && slots[j].Sub(slots[i]) < p.Window {
				j++
			}
			if j-i > p.Limit {
				t.Fatalf("%d admitted within %s from %s, the larger policy allows %d", j-i, p.Window, slots[i].Format(time.StampMicro), p.Limit)
			}
		}
	}
}

// larger returns the policy of c with the larger capacity.
func larger(c change) throttle.Policy {
	capacity := func(p throttle.Policy) int {
		switch p := p.(type) {
		case throttle.GCRA, throttle.TokenBucket, throttle.LeakyBucket:
			_, b := meterOf(p)
			return b
		case throttle.Quota:
			return p.Limit
		default:
			n, _ := countOf(p)
			return n
		}
	}
	if capacity(c.new) > capacity(c.old) {
		return c.new
	}
	return c.old
}

func meterOf(p throttle.Policy) (throttle.Rate, int) {
	switch p := p.(type) {
	case throttle.GCRA:
		return p.Rate, p.Burst
	case throttle.TokenBucket:
		return p.Rate, p.Burst
	case throttle.LeakyBucket:
		return p.Rate, p.Capacity
	}
	panic("not a meter")
}

func countOf(p throttle.Policy) (int, time.Duration) {
	switch p := p.(type) {
	case throttle.FixedWindow:
		return p.Limit, p.Window
	case throttle.SlidingWindow:
		return p.Limit, p.Window
	case throttle.SlidingLog:
		return p.Limit, p.Window
	}
	panic("not a window")
}

// TestRetryAfterIsExactAcrossAChange: after a named limiter's policy
// changed, the first refusal under the new policy says exactly when the
// same request is admitted: at now + RetryAfter it is, a microsecond
// earlier it is not, also while the state the old policy left keeps
// draining at the old pace (GCRA 10/s burst 10, then 5/s burst 5: the
// first refusal said 1.2 s, the key was admitted from 0.6 s). Both
// directions of every change, for one unit and for two, the old units
// taken at a window's start and 0.37 s into it, then 0.2 s later; Redis's
// clock is driven.
func TestRetryAfterIsExactAcrossAChange(t *testing.T) {
	for _, c := range changes() {
		for _, reverse := range []bool{false, true} {
			for _, step := range []struct {
				n    int
				into time.Duration
			}{{1, 0}, {2, 0}, {1, 370 * time.Millisecond}, {3, 370 * time.Millisecond}} {
				n := step.n
				first, second := c.old, c.new
				if reverse {
					first, second = c.new, c.old
				}
				t.Run(first.String()+" then "+second.String()+" n="+itoa(n)+" at "+step.into.String(), func(t *testing.T) {
					tg := redistest.Embedded(t)
					clock := tg.Clock(t)
					clock.Set(time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC).Add(step.into))
					before := newNamedLimiter(t, tg, "partner-api", first)
					after := newNamedLimiter(t, tg, "partner-api", second)
					drain(t, before, "tenant-1")
					if step.into > 0 {
						clock.Advance(200 * time.Millisecond)
					}
					// what the new policy admits at once, if anything
					for allowN(t, after, "tenant-1", n).Allowed {
					}
					r := allowN(t, after, "tenant-1", n)
					if r.Allowed || r.RetryAfter <= 0 {
						t.Fatalf("refused, then %+v", r)
					}
					clock.Advance(r.RetryAfter - time.Microsecond)
					if early := allowN(t, after, "tenant-1", n); early.Allowed {
						t.Fatalf("RetryAfter %s, but admitted a microsecond earlier", r.RetryAfter)
					}
					clock.Advance(time.Microsecond)
					if on := allowN(t, after, "tenant-1", n); !on.Allowed {
						t.Fatalf("RetryAfter %s, but refused then: %+v", r.RetryAfter, on)
					}
				})
			}
		}
	}
}
