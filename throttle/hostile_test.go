package throttle_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// hostileKeys are caller keys a careless or malicious caller might pass.
func hostileKeys(prefix string) map[string]string {
	return map[string]string{
		"1 MB":            strings.Repeat("x", 1<<20),
		"binary":          "\x00\x01\xfe\xff\r\n",
		"invalid UTF-8":   "\xc3\x28\xa0\xa1",
		"open brace":      "{",
		"close brace":     "}",
		"braces":          "}{",
		"empty tag":       "{}",
		"escaped brace":   "%7B",
		"hash mark":       "%#",
		"the prefix":      prefix,
		"a Redis key":     prefix + "gcra:1/1h0m0s:1:{x}",
		"another tag":     "a}:{b",
		"space and colon": " : ",
	}
}

// sentinels are the errors bad input may wrap.
var sentinels = []error{
	throttle.ErrInvalidKey, throttle.ErrInvalidN, throttle.ErrExceedsLimit,
	throttle.ErrInvalidDelay, throttle.ErrNotSupported, throttle.ErrInvalidPolicy, throttle.ErrInvalidOption,
}

// wantSentinel fails the test unless err wraps want (nil: no error).
func wantSentinel(t *testing.T, what string, err, want error) {
	t.Helper()
	if want == nil {
		if err != nil {
			t.Fatalf("%s: %v, want no error", what, err)
		}
		return
	}
	if !errors.Is(err, want) {
		t.Fatalf("%s: %v, want an error wrapping %v", what, err, want)
	}
	if !strings.HasPrefix(err.Error(), "throttle:") {
		t.Fatalf("%s: error %q does not say where it comes from", what, err)
	}
}

// TestHostileInput sends every algorithm, with capacity 1, hostile keys,
// counts and durations, and checks that each gets its own state, bad input
// a clear error, and that no key is left without a TTL.
func TestHostileInput(t *testing.T) {
	tg := redistest.New(t)
	ctx := context.Background()
	const years = 100 * 365 * 24 * time.Hour
	decisions := 0
	for _, hashing := range []bool{false, true} {
		for _, a := range algorithmsWith(1, time.Hour, throttle.PerHour(1)) {
			opts := []throttle.Option{throttle.WithCoalescing(0)}
			if hashing {
				opts = append(opts, throttle.WithKeyHashing(256), throttle.WithPrefix(tg.Prefix+"hashed:"))
			}
			l := newLimiter(t, tg, a.policy, opts...)
			reservable := l.CanReserveAhead()
			for name, key := range hostileKeys(tg.Prefix) {
				what := a.name + " " + name
				if hashing {
					what += " (hashed)"
				}
				// Its own state: full at first, then spent.
				if r := allowN(t, l, key, 1); !r.Allowed {
					t.Fatalf("%s: first request rejected, the key shares state: %+v", what, r)
				}
				if r := allowN(t, l, key, 1); r.Allowed {
					t.Fatalf("%s: second request admitted past a limit of 1: %+v", what, r)
				}
				decisions += 2
				for _, n := range []int{0, -1, -1 << 62, 2, 1 << 62} {
					_, err := l.AllowN(ctx, key, n)
					want := throttle.ErrInvalidN
					if n > 1 {
						want = throttle.ErrExceedsLimit
					}
					wantSentinel(t, what+" AllowN("+itoa(n)+")", err, want)
				}
				for _, tc := range []struct {
					d     time.Duration
					block error // BlockFor's error
					res   error // Reserve's error
				}{
					{0, throttle.ErrInvalidDelay, nil},
					{-time.Second, throttle.ErrInvalidDelay, throttle.ErrInvalidDelay},
					{-1 << 63, throttle.ErrInvalidDelay, throttle.ErrInvalidDelay},
					{300 * time.Microsecond, nil, throttle.ErrNotSupported},
					{time.Nanosecond, nil, throttle.ErrNotSupported},
					{years, throttle.ErrInvalidDelay, throttle.ErrNotSupported},
					{1<<63 - 1, throttle.ErrInvalidDelay, throttle.ErrNotSupported},
				} {
					wantSentinel(t, what+" BlockFor("+tc.d.String()+")", l.BlockFor(ctx, key, tc.d), tc.block)
					want := tc.res
					if reservable && tc.d > 0 {
						want = nil
					}
					res, err := l.Reserve(ctx, key, 1, tc.d)
					wantSentinel(t, what+" Reserve("+tc.d.String()+")", err, want)
					if err == nil && res.OK {
						_ = res.Cancel(ctx)
					}
				}
				if _, err := l.Peek(ctx, key); err != nil {
					t.Fatalf("%s: Peek: %v", what, err)
				}
				if _, err := l.BlockedFor(ctx, key); err != nil {
					t.Fatalf("%s: BlockedFor: %v", what, err)
				}
				if hashing && len(key) > 256 {
					if n := len(l.Key(key)); n > 200 {
						t.Fatalf("%s: hashed Redis key is %d bytes long", what, n)
					}
				}
			}
			for _, op := range []func() error{
				func() error { _, err := l.Allow(ctx, ""); return err },
				func() error { _, err := l.Peek(ctx, ""); return err },
				func() error { return l.Reset(ctx, "") },
				func() error { return l.BlockFor(ctx, "", time.Second) },
				func() error { _, err := l.Reserve(ctx, "", 1, 0); return err },
			} {
				wantSentinel(t, a.name+" empty key", op(), throttle.ErrInvalidKey)
			}
		}
	}
	checkTTLs(t, tg)
	t.Logf("figures: %s: %d hostile keys x 6 algorithms x 2 key forms, %d decisions, every key with its own state and a TTL",
		tg.Kind, len(hostileKeys(tg.Prefix)), decisions)
}

// TestKeyHashingKeepsKeysApart: long caller keys that differ only in their
// last byte keep separate state when hashed, and a caller key written like
// a hashed one is not taken for it.
func TestKeyHashingKeepsKeysApart(t *testing.T) {
	tg := redistest.New(t)
	l := newLimiter(t, tg, throttle.FixedWindow{Limit: 1, Window: redistest.FarWindow}, throttle.WithKeyHashing(8))
	long := strings.Repeat("tenant-", 100)
	hashed := l.Key(long + "a")
	asHashed := hashed[strings.IndexByte(hashed, '{')+1 : len(hashed)-1] // "%#" and the hex
	keys := []string{long + "a", long + "b", "short", asHashed}
	seen := map[string]bool{}
	for _, k := range keys {
		if seen[l.Key(k)] {
			t.Fatalf("caller key %.40q shares the Redis key %q", k, l.Key(k))
		}
		seen[l.Key(k)] = true
		if r := allowN(t, l, k, 1); !r.Allowed {
			t.Fatalf("caller key %.40q shares state: %+v", k, r)
		}
	}
	if n := len(l.Key(long + "a")); n != len(tg.Prefix)+len(l.Name()+"@fw:{}")+keyspace.HashedLen {
		t.Fatalf("hashed Redis key %q is %d bytes", l.Key(long+"a"), n)
	}
	if _, err := throttle.New(tg.Client, "limiter", throttle.GCRA{Rate: throttle.PerSecond(1), Burst: 1}, throttle.WithKeyHashing(-1)); !errors.Is(err, throttle.ErrInvalidOption) {
		t.Fatalf("WithKeyHashing(-1): %v", err)
	}
	checkTTLs(t, tg)
}

// FuzzHostileRequests builds a policy from fuzzed numbers and sends it two
// fuzzed caller keys, a fuzzed n and a fuzzed duration: nothing panics,
// every error wraps one of the package's sentinels, every key written has
// a TTL, and two distinct caller keys never share state.
func FuzzHostileRequests(f *testing.F) {
	f.Add(byte(0), int64(1), int64(time.Second), "a", "b", 1, int64(time.Second), false)
	f.Add(byte(3), int64(5), int64(time.Millisecond), "{", "}", 0, int64(-1), true)
	f.Add(byte(5), int64(1<<40), int64(1), "\x00\xff", "%7B", -3, int64(1<<62), false)
	f.Add(byte(1), int64(-1), int64(100*365*24*time.Hour), "", "x", 1<<40, int64(500*time.Microsecond), true)
	f.Add(byte(2), int64(2), int64(999*time.Microsecond), "%#ab", "%25#ab", 2, int64(time.Nanosecond), false)
	tg := redistest.Embedded(f)
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, which byte, limit, window int64, key1, key2 string, n int, d int64, hashing bool) {
		rate := throttle.Rate{N: int(limit), Per: time.Duration(window)}
		policies := []throttle.Policy{
			throttle.FixedWindow{Limit: int(limit), Window: time.Duration(window)},
			throttle.SlidingLog{Limit: int(limit), Window: time.Duration(window)},
			throttle.SlidingWindow{Limit: int(limit), Window: time.Duration(window)},
			throttle.TokenBucket{Rate: rate, Burst: int(limit)},
			throttle.LeakyBucket{Rate: rate, Capacity: int(limit)},
			throttle.GCRA{Rate: rate, Burst: int(limit)},
		}
		p := policies[int(which)%len(policies)]
		opts := []throttle.Option{throttle.WithPrefix(tg.Prefix), throttle.WithCoalescing(0)}
		if hashing {
			opts = append(opts, throttle.WithKeyHashing(16))
		}
		l, err := throttle.New(tg.Client, "l", p, opts...)
		if err != nil {
			if !errors.Is(err, throttle.ErrInvalidPolicy) {
				t.Fatalf("New(%#v): %v, want ErrInvalidPolicy", p, err)
			}
			return
		}
		checkErr := func(what string, err error) {
			t.Helper()
			for _, s := range sentinels {
				if errors.Is(err, s) {
					return
				}
			}
			if err != nil {
				t.Fatalf("%s: %v wraps none of the package's errors", what, err)
			}
		}
		_, err = l.AllowN(ctx, key1, n)
		checkErr("AllowN", err)
		res, err := l.Reserve(ctx, key1, n, time.Duration(d))
		checkErr("Reserve", err)
		if err == nil && res.OK {
			checkErr("Cancel", res.Cancel(ctx))
		}
		checkErr("BlockFor", l.BlockFor(ctx, key2, time.Duration(d)))
		_, err = l.Peek(ctx, key2)
		checkErr("Peek", err)
		for _, k := range []string{key1, key2} {
			if k == "" {
				continue
			}
			for _, redisKey := range []string{l.Key(k), l.Key(k) + ":block"} {
				if ttl := tg.Mini.TTL(redisKey); tg.Mini.Exists(redisKey) && ttl <= 0 {
					t.Fatalf("%#v: key %q has no TTL", p, redisKey)
				}
			}
		}
		// Two distinct caller keys: spending one leaves the other whole.
		if key1 == "" || key2 == "" || key1 == key2 {
			return
		}
		for _, k := range []string{key1, key2} {
			if err := l.Reset(ctx, k); err != nil {
				t.Fatal(err)
			}
		}
		capacity := peek(t, l, key1).Limit
		if r := allowN(t, l, key1, capacity); !r.Allowed {
			t.Fatalf("%#v: %q after Reset rejected: %+v", p, key1, r)
		}
		if r := allowN(t, l, key2, 1); !r.Allowed {
			t.Fatalf("%#v: %q was spent and %q is rejected: %+v", p, key1, key2, r)
		}
	})
}
