package throttle_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatalf("time zone %s: %v", name, err)
	}
	return loc
}

// TestQuotaTurnsAtMidnightInItsZone: on Redis's clock, driven to instants
// chosen in the quota's zone (far from this process's own clock, which
// the limiter learns), a quota admits its Limit, then rejects with
// RetryAfter exactly the time left until the period turns, daylight
// saving days and month lengths included, and admits again once it has.
func TestQuotaTurnsAtMidnightInItsZone(t *testing.T) {
	newYork, paris := mustZone(t, "America/New_York"), mustZone(t, "Europe/Paris")
	// Zones whose clocks skip midnight (00:00 -> 01:00) on these days: the
	// day starts at 01:00; time.Date's midnight is 23:00 of the day before.
	santiago, azores := mustZone(t, "America/Santiago"), mustZone(t, "Atlantic/Azores")
	havana, asuncion := mustZone(t, "America/Havana"), mustZone(t, "America/Asuncion")
	for _, tc := range []struct {
		name   string
		quota  throttle.Quota
		at     time.Time
		turnIn time.Duration
	}{
		{"day, 2 s before midnight", throttle.Quota{Limit: 3, Period: throttle.Day, Location: newYork},
			time.Date(2026, 3, 14, 23, 59, 58, 0, newYork), 2 * time.Second},
		{"day the clocks spring forward (23 h)", throttle.Quota{Limit: 3, Period: throttle.Day, Location: newYork},
			time.Date(2026, 3, 8, 0, 0, 0, 0, newYork), 23 * time.Hour},
		{"day the clocks fall back (25 h)", throttle.Quota{Limit: 3, Period: throttle.Day, Location: newYork},
			time.Date(2026, 11, 1, 0, 0, 0, 0, newYork), 25 * time.Hour},
		{"day in UTC, no zone given", throttle.Quota{Limit: 1, Period: throttle.Day},
			time.Date(2026, 6, 30, 12, 0, 0, 0, time.UTC), 12 * time.Hour},
		{"February", throttle.Quota{Limit: 4, Period: throttle.Month, Location: paris},
			time.Date(2026, 2, 1, 0, 0, 0, 0, paris), 28 * 24 * time.Hour},
		{"an hour before the month ends", throttle.Quota{Limit: 4, Period: throttle.Month, Location: paris},
			time.Date(2026, 1, 31, 23, 0, 0, 0, paris), time.Hour},
		{"March in Paris, 23 days and 23 h", throttle.Quota{Limit: 2, Period: throttle.Month, Location: paris},
			time.Date(2026, 3, 8, 0, 0, 0, 0, paris), 23*24*time.Hour + 23*time.Hour},
		{"Santiago, 22:30 before midnight is skipped", throttle.Quota{Limit: 2, Period: throttle.Day, Location: santiago},
			time.Date(2026, 9, 5, 22, 30, 0, 0, santiago), 90 * time.Minute},
		{"Santiago, 23:30 before midnight is skipped", throttle.Quota{Limit: 2, Period: throttle.Day, Location: santiago},
			time.Date(2026, 9, 5, 23, 30, 0, 0, santiago), 30 * time.Minute},
		{"Santiago, the day that starts at 01:00 (23 h)", throttle.Quota{Limit: 2, Period: throttle.Day, Location: santiago},
			time.Date(2026, 9, 6, 1, 0, 0, 0, santiago), 23 * time.Hour},
		{"Azores, midnight skipped", throttle.Quota{Limit: 1, Period: throttle.Day, Location: azores},
			time.Date(2026, 3, 28, 23, 0, 0, 0, azores), time.Hour},
		{"Havana, midnight skipped", throttle.Quota{Limit: 1, Period: throttle.Day, Location: havana},
			time.Date(2026, 3, 7, 20, 0, 0, 0, havana), 4 * time.Hour},
		{"Asuncion, midnight skipped", throttle.Quota{Limit: 1, Period: throttle.Day, Location: asuncion},
			time.Date(2024, 10, 5, 23, 59, 0, 0, asuncion), time.Minute},
		{"Havana, midnight twice (25 h from the first)", throttle.Quota{Limit: 1, Period: throttle.Day, Location: havana},
			time.Date(2026, 11, 1, 4, 0, 0, 0, time.UTC), 25 * time.Hour},
		{"Santiago, the month of the skip", throttle.Quota{Limit: 2, Period: throttle.Month, Location: santiago},
			time.Date(2026, 9, 30, 23, 0, 0, 0, santiago), time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tg := redistest.Embedded(t)
			clock := tg.Clock(t)
			clock.Set(tc.at)
			l := newLimiter(t, tg, tc.quota)
			if got := drain(t, l, "partner"); got != tc.quota.Limit {
				t.Fatalf("admitted %d in the period, want %d", got, tc.quota.Limit)
			}
			r := allowN(t, l, "partner", 1)
			if r.Allowed || r.RetryAfter != tc.turnIn || r.ResetAfter != tc.turnIn || r.Remaining != 0 {
				t.Fatalf("a unit over the quota: %+v; want rejected, RetryAfter and ResetAfter %s", r, tc.turnIn)
			}
			clock.Advance(tc.turnIn - time.Microsecond)
			if allowN(t, l, "partner", 1).Allowed {
				t.Fatal("admitted a microsecond before the period turned")
			}
			clock.Advance(time.Microsecond)
			if r := allowN(t, l, "partner", 1); !r.Allowed || r.Remaining != tc.quota.Limit-1 {
				t.Fatalf("at the turn: %+v; want admitted with %d remaining", r, tc.quota.Limit-1)
			}
		})
	}
}

// TestQuotaChangeKeepsTheCount: raising a named quota mid-day keeps what
// the day consumed; moving it to another zone carries the count into the
// new zone's day while the old day lasts.
func TestQuotaChangeKeepsTheCount(t *testing.T) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	paris, tokyo := mustZone(t, "Europe/Paris"), mustZone(t, "Asia/Tokyo")
	clock.Set(time.Date(2026, 5, 4, 10, 0, 0, 0, paris))
	old := newNamedLimiter(t, tg, "partner", throttle.Quota{Limit: 3, Period: throttle.Day, Location: paris})
	raised := newNamedLimiter(t, tg, "partner", throttle.Quota{Limit: 5, Period: throttle.Day, Location: paris})
	moved := newNamedLimiter(t, tg, "partner", throttle.Quota{Limit: 5, Period: throttle.Day, Location: tokyo})
	if got := drain(t, old, "acme"); got != 3 {
		t.Fatalf("the old quota admitted %d, want 3", got)
	}
	if got := drain(t, raised, "acme"); got != 2 {
		t.Errorf("the raised quota admitted %d more the same day, want 2", got)
	}
	if r := peek(t, moved, "acme"); r.Allowed || r.Remaining != 0 {
		t.Errorf("in Tokyo's day, while Paris's lasts: %+v; want the count carried over", r)
	}
}

// TestQuotaOnTheRealClock: on every backend, a daily quota in UTC rejects
// its third unit until the next UTC midnight, as this process sees it
// (within the measured clock offset and a second).
func TestQuotaOnTheRealClock(t *testing.T) {
	tg := redistest.New(t)
	l := newLimiter(t, tg, throttle.Quota{Limit: 2, Period: throttle.Day})
	if got := drain(t, l, "acme"); got != 2 {
		t.Fatalf("admitted %d, want 2", got)
	}
	r := allowN(t, l, "acme", 1)
	now := time.Now().Add(redistest.ClockOffset(t, tg.Client)).UTC()
	midnight := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)
	if want := midnight.Sub(now); r.Allowed || r.RetryAfter < want-time.Second || r.RetryAfter > want+time.Second {
		t.Errorf("over the quota: %+v; want RetryAfter about %s, to UTC midnight", r, want)
	}
	if _, err := l.AllowN(context.Background(), "acme", 3); !errors.Is(err, throttle.ErrExceedsLimit) {
		t.Errorf("3 units of a quota of 2: %v, want ErrExceedsLimit", err)
	}
	results, err := l.AllowMany(context.Background(), []throttle.Request{{Key: "b", N: 1}, {Key: "b", N: 2}})
	if err != nil || !results[0].Allowed || results[1].Allowed {
		t.Errorf("AllowMany = %+v, %v; want the first admitted, the second not", results, err)
	}
}

// TestQuotaValidation: what a Quota refuses.
func TestQuotaValidation(t *testing.T) {
	for _, q := range []throttle.Quota{
		{Limit: 0, Period: throttle.Day},
		{Limit: 1},
		{Limit: 1, Period: 3},
		{Limit: 1 << 51, Period: throttle.Month},
	} {
		if err := q.Validate(); !errors.Is(err, throttle.ErrInvalidPolicy) {
			t.Errorf("%#v.Validate() = %v, want ErrInvalidPolicy", q, err)
		}
	}
	for _, s := range []string{"quota:10/week", "quota:10/day:Mars/Olympus", "quota:day", "quota:-1/day"} {
		if _, err := throttle.ParsePolicy(s); !errors.Is(err, throttle.ErrInvalidPolicy) {
			t.Errorf("ParsePolicy(%q) = %v, want ErrInvalidPolicy", s, err)
		}
	}
}
