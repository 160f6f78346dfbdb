package throttle_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

func TestKeyLayout(t *testing.T) {
	tg := redistest.Embedded(t)
	for _, tc := range []struct {
		policy throttle.Policy
		want   string
	}{
		{throttle.FixedWindow{Limit: 25, Window: time.Minute}, "throttle:partner-api@fw:{tenant-1}"},
		{throttle.SlidingLog{Limit: 25, Window: time.Second}, "throttle:partner-api@sl:{tenant-1}"},
		{throttle.SlidingWindow{Limit: 25, Window: time.Second}, "throttle:partner-api@sw:{tenant-1}"},
		{throttle.TokenBucket{Rate: throttle.PerSecond(10), Burst: 5}, "throttle:partner-api@tb:{tenant-1}"},
		{throttle.LeakyBucket{Rate: throttle.PerMinute(10), Capacity: 5}, "throttle:partner-api@lb:{tenant-1}"},
		{throttle.GCRA{Rate: throttle.PerHour(10), Burst: 1}, "throttle:partner-api@gcra:{tenant-1}"},
	} {
		l, err := throttle.New(tg.Client, "partner-api", tc.policy)
		if err != nil {
			t.Fatal(err)
		}
		if got := l.Key("tenant-1"); got != tc.want {
			t.Errorf("%#v: key %q, want %q", tc.policy, got, tc.want)
		}
	}
	l, err := throttle.New(tg.Client, "l", throttle.GCRA{Rate: throttle.PerSecond(1), Burst: 1}, throttle.WithPrefix("app:"))
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Key("x"); got != "app:l@gcra:{x}" {
		t.Errorf("WithPrefix: key %q", got)
	}
	// A prefix holding a hash tag puts every key in that tag's slot; the
	// key still reads back (throttlectl, the dashboard).
	l, err = throttle.New(tg.Client, "l", throttle.GCRA{Rate: throttle.PerSecond(1), Burst: 1}, throttle.WithPrefix("app:{jobs}:"))
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Key("x"); got != "app:{jobs}:l@gcra:{x}" || keyspace.HashTag(got) != "jobs" {
		t.Errorf("WithPrefix with a hash tag: key %q, tag %q", got, keyspace.HashTag(got))
	}
	if info, err := throttle.ParseKey("app:{jobs}:", l.Key("x")); err != nil || info.Caller != "x" || info.Name != "l" {
		t.Errorf("a key under a tagged prefix read back as %+v, %v", info, err)
	}
	for _, bad := range []string{"app:{}:", "app:{jobs:", "{a}{b}", "a}"} {
		if _, err := throttle.New(tg.Client, "l", throttle.GCRA{Rate: throttle.PerSecond(1), Burst: 1}, throttle.WithPrefix(bad)); !errors.Is(err, throttle.ErrInvalidOption) {
			t.Errorf("WithPrefix(%q): %v, want ErrInvalidOption", bad, err)
		}
	}
}

// TestCallerKeysCannotEscapeTheirTag checks that braces in caller keys
// neither change the Cluster slot nor make two caller keys share state.
func TestCallerKeysCannotEscapeTheirTag(t *testing.T) {
	tg := redistest.Embedded(t)
	tg.Clock(t)
	l := newLimiter(t, tg, throttle.FixedWindow{Limit: 1, Window: time.Hour})
	callerKeys := []string{"a", "a}", "{a}", "a%7D", "a%", "%", "{", "}", "}{", "{}", "x}:{y", "tenant{1}", "tenant%7B1%7D", "\x00\xff", "ünï"}
	seen := map[string]string{}
	for _, k := range callerKeys {
		redisKey := l.Key(k)
		if prev, dup := seen[redisKey]; dup {
			t.Fatalf("caller keys %q and %q share the Redis key %q", prev, k, redisKey)
		}
		seen[redisKey] = k
		tag := keyspace.HashTag(redisKey)
		if strings.ContainsAny(tag, "{}") || !strings.HasSuffix(redisKey, "{"+tag+"}") {
			t.Fatalf("caller key %q: Redis key %q hashes on %q, not on the whole caller key", k, redisKey, tag)
		}
		if r := allowN(t, l, k, 1); !r.Allowed {
			t.Fatalf("caller key %q shares state with an earlier one: %+v", k, r)
		}
	}
	if keys := tg.Keys(t); len(keys) != len(callerKeys) {
		t.Fatalf("%d caller keys wrote %d Redis keys", len(callerKeys), len(keys))
	}
}
