package fleet

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// redisNow returns the Redis clock at a whole second.
func redisNow(t *testing.T, c redis.UniversalClient) time.Time {
	t.Helper()
	now, err := Now(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	return now.Truncate(time.Second)
}

// flush writes one batch with the given process name.
func flush(t *testing.T, c redis.UniversalClient, prefix, process string, limiters map[string]*LimiterBatch, now time.Time) int {
	t.Helper()
	n, err := Flush(context.Background(), c, prefix, &Batch{Process: process, Limiters: limiters}, now)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// one returns a batch of one limiter whose key counts c at second unix
// (the limiter's totals the same).
func one(limiter, key string, unix int64, c Counts) map[string]*LimiterBatch {
	return map[string]*LimiterBatch{limiter: {
		Kind:    "rate",
		Seconds: []Second{{Unix: unix, Counts: c}},
		Callers: map[string]*Caller{key: {Seconds: []Second{{Unix: unix, Counts: c}}}},
	}}
}

func sum(points []Point) (c Counts) {
	for _, p := range points {
		c.Admitted += p.Admitted
		c.Throttled += p.Throttled
		c.Rescheduled += p.Rescheduled
	}
	return c
}

func TestSeriesLandInTheirSecond(t *testing.T) {
	r := redistest.New(t)
	ctx := context.Background()
	now := redisNow(t, r.Client)
	at := now.Add(-90 * time.Second) // another minute than now's, most likely
	flush(t, r.Client, r.Prefix, "p1", one("api", "acme", at.Unix(), Counts{Admitted: 3, Throttled: 2, Rescheduled: 1}), now)
	flush(t, r.Client, r.Prefix, "p1", one("api", "other", now.Unix(), Counts{Admitted: 1}), now)

	points, err := LimiterSeries(ctx, r.Client, r.Prefix, "api", now.Add(-2*time.Minute), now.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if len(points) != 121 {
		t.Fatalf("%d points, want 121 (one a second, zeros included)", len(points))
	}
	for i, p := range points {
		if !p.At.Equal(now.Add(-2*time.Minute + time.Duration(i)*time.Second)) {
			t.Fatalf("point %d at %v", i, p.At)
		}
		want := Counts{}
		switch {
		case p.At.Equal(at):
			want = Counts{3, 2, 1}
		case p.At.Equal(now):
			want = Counts{Admitted: 1}
		}
		if got := (Counts{p.Admitted, p.Throttled, p.Rescheduled}); got != want {
			t.Errorf("second %v: %+v, want %+v", p.At, got, want)
		}
	}
	keyPoints, err := KeySeries(ctx, r.Client, r.Prefix, "api", "acme", now.Add(-2*time.Minute), now.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if got := sum(keyPoints); got != (Counts{3, 2, 1}) {
		t.Errorf("acme's series sums to %+v", got)
	}
}

func TestOddNamesRoundTrip(t *testing.T) {
	r := redistest.New(t)
	ctx := context.Background()
	now := redisNow(t, r.Client)
	limiter := "lim {x} %7B"
	keys := []string{"{tenant}", "100% } {", "<script>alert(1)</script>", "a key with spaces", "%7B", "{"}
	batch := map[string]*LimiterBatch{limiter: {Kind: "rate", Callers: map[string]*Caller{}}}
	for i, k := range keys {
		c := Counts{Admitted: int64(i + 1), Throttled: int64(10 * (i + 1))}
		batch[limiter].Seconds = Add(batch[limiter].Seconds, now.Unix(), c)
		batch[limiter].Callers[k] = &Caller{Seconds: []Second{{Unix: now.Unix(), Counts: c}}}
	}
	flush(t, r.Client, r.Prefix, "p", batch, now)
	rows, total, err := Ranked(ctx, r.Client, r.Prefix, limiter, HeldBack, now.Add(-time.Minute), "", 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	if total != len(keys) || len(rows) != len(keys) {
		t.Fatalf("total %d, %d rows, want %d", total, len(rows), len(keys))
	}
	for i, row := range rows {
		k := len(keys) - 1 - i // ranked by held back, most first
		if row.Key != keys[k] || row.HeldBack != int64(10*(k+1)) || row.Admitted != int64(k+1) {
			t.Errorf("row %d = %+v, want %q with %d held back, %d admitted", i, row, keys[k], 10*(k+1), k+1)
		}
		points, err := KeySeries(ctx, r.Client, r.Prefix, limiter, row.Key, now, now.Add(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if got := sum(points); got.Throttled != row.HeldBack {
			t.Errorf("KeySeries(%q) = %+v", row.Key, got)
		}
	}
	limiters, err := Limiters(ctx, r.Client, r.Prefix)
	if err != nil || len(limiters) != 1 || limiters[0].Name != limiter {
		t.Errorf("Limiters = %+v, %v", limiters, err)
	}
}

func TestRankedPages(t *testing.T) {
	r := redistest.New(t)
	ctx := context.Background()
	now := redisNow(t, r.Client)
	batch := map[string]*LimiterBatch{"api": {Kind: "rate", Callers: map[string]*Caller{}}}
	// user:01 .. user:09 held back 1..9, admitted 100-i; team:1 admitted only
	for i := 1; i <= 9; i++ {
		batch["api"].Callers[fmt.Sprintf("user:%02d", i)] = &Caller{Seconds: []Second{{Unix: now.Unix(), Counts: Counts{Throttled: int64(i), Admitted: int64(100 - i)}}}}
	}
	batch["api"].Callers["team:1"] = &Caller{Seconds: []Second{{Unix: now.Unix(), Counts: Counts{Admitted: 1000}}}}
	batch["api"].Seconds = []Second{{Unix: now.Unix(), Counts: Counts{Admitted: 1}}}
	flush(t, r.Client, r.Prefix, "p", batch, now)

	tests := []struct {
		name          string
		by            Rank
		filter        string
		offset, count int
		want          []string
		total         int
	}{
		{"first page", HeldBack, "", 0, 3, []string{"user:09", "user:08", "user:07"}, 10},
		{"second page", HeldBack, "", 3, 3, []string{"user:06", "user:05", "user:04"}, 10},
		{"last page, admitted-only key last", HeldBack, "", 8, 5, []string{"user:01", "team:1"}, 10},
		{"past the end", HeldBack, "", 20, 5, nil, 10},
		{"by admitted", Admitted, "", 0, 2, []string{"team:1", "user:01"}, 10},
		{"filtered", HeldBack, "user:0", 1, 2, []string{"user:08", "user:07"}, 9},
		{"filter matching none", HeldBack, "nobody", 0, 5, nil, 0},
		{"filter and all", Admitted, "team", 0, -1, []string{"team:1"}, 1},
		{"count zero", HeldBack, "", 0, 0, nil, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rows, total, err := Ranked(ctx, r.Client, r.Prefix, "api", tt.by, now.Add(-time.Minute), tt.filter, tt.offset, tt.count)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, row := range rows {
				got = append(got, row.Key)
				if strings.HasPrefix(row.Key, "user:") {
					var i int
					fmt.Sscanf(row.Key, "user:%d", &i)
					if row.HeldBack != int64(i) || row.Admitted != int64(100-i) {
						t.Errorf("%+v: counts wrong", row)
					}
				}
			}
			if !slices.Equal(got, tt.want) || total != tt.total {
				t.Errorf("got %q (total %d), want %q (total %d)", got, total, tt.want, tt.total)
			}
		})
	}

	activity, err := Activity(ctx, r.Client, r.Prefix, "api", now.Add(-time.Minute), []string{"user:03", "team:1", "nobody"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]KeyActivity{
		"user:03": {Key: "user:03", Admitted: 97, HeldBack: 3},
		"team:1":  {Key: "team:1", Admitted: 1000},
	}
	if len(activity) != len(want) || activity["user:03"] != want["user:03"] || activity["team:1"] != want["team:1"] {
		t.Errorf("Activity = %+v, want %+v", activity, want)
	}
}

func TestProcessesAggregate(t *testing.T) {
	r := redistest.New(t)
	ctx := context.Background()
	now := redisNow(t, r.Client)
	for i, process := range []string{"host-a:1", "host-b:2", "host-c:3"} {
		flush(t, r.Client, r.Prefix, process, one("api", "acme", now.Unix(), Counts{Admitted: int64(i + 1), Rescheduled: 1}), now.Add(time.Duration(i)*time.Millisecond))
	}
	points, err := LimiterSeries(ctx, r.Client, r.Prefix, "api", now, now.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if got := sum(points); got != (Counts{Admitted: 6, Rescheduled: 3}) {
		t.Errorf("three processes' counts sum to %+v", got)
	}
	procs, err := Processes(ctx, r.Client, r.Prefix, now.Add(-time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if len(procs) != 3 || procs[0].Name != "host-c:3" || !procs[0].Seen.Equal(now.Add(2*time.Millisecond)) {
		t.Errorf("Processes = %+v", procs)
	}
	if procs, _ := Processes(ctx, r.Client, r.Prefix, now.Add(time.Second)); len(procs) != 0 {
		t.Errorf("Processes since later = %+v", procs)
	}
	// a flush 11 minutes on drops the processes silent for 10 minutes
	flush(t, r.Client, r.Prefix, "host-d:4", nil, now.Add(11*time.Minute))
	if n, _ := r.Client.ZCard(ctx, procsKey(r.Prefix)).Result(); n != 1 {
		t.Errorf("%d processes kept, want 1", n)
	}
}

func TestLimiterRecordKeepsWhatItKnows(t *testing.T) {
	r := redistest.New(t)
	ctx := context.Background()
	now := redisNow(t, r.Client)
	b := one("api", "k", now.Unix(), Counts{Admitted: 1})
	b["api"].CodePolicy = "gcra:10/1s:5"
	b["api"].Kind = "concurrency"
	flush(t, r.Client, r.Prefix, "p1", b, now)
	b = one("api", "k", now.Unix(), Counts{Rescheduled: 1})
	b["api"].Kind = "" // a worker's events alone
	flush(t, r.Client, r.Prefix, "p2", b, now.Add(time.Second))
	got, err := Limiters(ctx, r.Client, r.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	want := []Limiter{{Name: "api", Kind: "concurrency", CodePolicy: "gcra:10/1s:5", Seen: time.UnixMilli(now.Add(time.Second).UnixMilli())}}
	if len(got) != 1 || got[0] != want[0] {
		t.Errorf("Limiters = %+v, want %+v", got, want)
	}
	if ttl := r.Client.TTL(ctx, limitersKey(r.Prefix)).Val(); ttl <= 23*time.Hour {
		t.Errorf("limiters' TTL %s", ttl)
	}
}

func TestKeyPolicy(t *testing.T) {
	r := redistest.New(t)
	ctx := context.Background()
	now := redisNow(t, r.Client)
	b := one("api", "acme", now.Add(-2*time.Minute).Unix(), Counts{Admitted: 1})
	b["api"].Callers["acme"].Policy, b["api"].Callers["acme"].Source = "gcra:1/1s:1", "plan"
	flush(t, r.Client, r.Prefix, "p", b, now)
	b = one("api", "acme", now.Unix(), Counts{Admitted: 1})
	b["api"].Callers["acme"].Policy, b["api"].Callers["acme"].Source = "fw:5/1m", "stored for key"
	flush(t, r.Client, r.Prefix, "p", b, now)
	for _, tt := range []struct {
		key, policy, source string
	}{{"acme", "fw:5/1m", "stored for key"}, {"nobody", "", ""}} {
		policy, source, err := KeyPolicy(ctx, r.Client, r.Prefix, "api", tt.key, now.Add(-5*time.Minute))
		if err != nil || policy != tt.policy || source != tt.source {
			t.Errorf("KeyPolicy(%q) = %q, %q, %v; want %q, %q", tt.key, policy, source, err, tt.policy, tt.source)
		}
	}
}

func TestMinuteKeysExpire(t *testing.T) {
	r := redistest.Embedded(t)
	clock := r.Clock(t)
	ctx := context.Background()
	now := clock.Now().Truncate(time.Second)
	flush(t, r.Client, r.Prefix, "p", one("api", "acme", now.Unix(), Counts{Admitted: 1, Throttled: 1}), clock.Now())
	for _, key := range r.Keys(t) {
		if ttl := r.Client.TTL(ctx, key).Val(); ttl <= 0 {
			t.Errorf("%s has no TTL", key)
		}
	}
	if n := len(r.Keys(t)); n != 6 {
		t.Errorf("%d keys written, want 6: %q", n, r.Keys(t))
	}
	clock.Advance(18 * time.Minute)
	if keys := r.Keys(t); len(keys) != 2 {
		t.Errorf("after 18 minutes, keys left %q; want the limiters' hash and the processes' set", keys)
	}
	clock.Advance(24 * time.Hour)
	if keys := r.Keys(t); len(keys) != 0 {
		t.Errorf("after a day, keys left %q", keys)
	}
}

func TestSeriesSpan(t *testing.T) {
	r := redistest.Embedded(t)
	now := time.Now().Truncate(time.Second)
	if _, err := LimiterSeries(context.Background(), r.Client, r.Prefix, "api", now.Add(-25*time.Hour), now); err == nil {
		t.Error("a 25-hour series was read")
	}
	if points, err := LimiterSeries(context.Background(), r.Client, r.Prefix, "api", now, now); err != nil || len(points) != 0 {
		t.Errorf("an empty span gave %d points, %v", len(points), err)
	}
}
