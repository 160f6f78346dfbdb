package throttle_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// parseClient is a client for limiters that only build keys: New and
// NewConcurrencyLimiter talk to no server.
var parseClient = redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})

// parsePolicies are policies of every type, with rates and windows whose
// short forms exercise the duration syntax (µs, fractions, hours).
var parsePolicies = []throttle.Policy{
	throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1},
	throttle.GCRA{Rate: throttle.PerHour(10), Burst: 5},
	throttle.GCRA{Rate: throttle.Rate{N: 7, Per: 1500 * time.Microsecond}, Burst: 13},
	throttle.TokenBucket{Rate: throttle.PerSecond(10), Burst: 5},
	throttle.TokenBucket{Rate: throttle.Rate{N: 3, Per: 90 * time.Minute}, Burst: 2},
	throttle.LeakyBucket{Rate: throttle.PerMinute(10), Capacity: 5},
	throttle.LeakyBucket{Rate: throttle.Rate{N: 1, Per: time.Microsecond}, Capacity: 1},
	throttle.FixedWindow{Limit: 25, Window: time.Minute},
	throttle.FixedWindow{Limit: 1, Window: 10 * 365 * 24 * time.Hour},
	throttle.SlidingLog{Limit: 25, Window: time.Second},
	throttle.SlidingLog{Limit: 3, Window: 2500 * time.Microsecond},
	throttle.SlidingWindow{Limit: 25, Window: time.Second},
	throttle.SlidingWindow{Limit: 100, Window: 36 * time.Hour},
}

var parseConcurrencies = []throttle.Concurrency{
	{Limit: 3, Lease: 30 * time.Second},
	{Limit: 1, Lease: 10 * time.Millisecond},
	{Limit: 50, Lease: 2*time.Hour + 1500*time.Microsecond},
}

// TestParsePolicyRoundTrip reads every policy type back from its short
// form (what the registry of names, stored policies and throttlectl
// hold), and the limiters' keys back to name, algorithm and caller key.
func TestParsePolicyRoundTrip(t *testing.T) {
	for _, p := range parsePolicies {
		got, err := throttle.ParsePolicy(fmt.Sprint(p))
		if err != nil || got != p {
			t.Errorf("ParsePolicy(%q) = %#v, %v; want %#v", fmt.Sprint(p), got, err, p)
		}
		l, err := throttle.New(parseClient, "partner-api", p)
		if err != nil {
			t.Fatal(err)
		}
		info, err := throttle.ParseKey(throttle.DefaultPrefix, l.Key("tenant-42"))
		if err != nil {
			t.Fatalf("ParseKey(%q): %v", l.Key("tenant-42"), err)
		}
		alg, _, _ := strings.Cut(fmt.Sprint(p), ":")
		if info.Name != "partner-api" || info.Algorithm != alg || info.Caller != "tenant-42" || info.Kind != keyspace.KeyState || info.Hashed || info.Concurrency() {
			t.Errorf("ParseKey(%q) = %+v", l.Key("tenant-42"), info)
		}
	}
	for _, p := range parseConcurrencies {
		form := fmt.Sprintf("conc:%d/%s", p.Limit, p.Lease)
		if got, err := throttle.ParseConcurrency(form); err != nil || got != p {
			t.Errorf("ParseConcurrency(%q) = %#v, %v; want %#v", form, got, err, p)
		}
		c, err := throttle.NewConcurrencyLimiter(parseClient, "exports", p)
		if err != nil {
			t.Fatal(err)
		}
		info, err := throttle.ParseKey(throttle.DefaultPrefix, c.Key("tenant-42"))
		if err != nil {
			t.Fatalf("ParseKey(%q): %v", c.Key("tenant-42"), err)
		}
		if info.Name != "exports" || info.Caller != "tenant-42" || !info.Concurrency() {
			t.Errorf("ParseKey(%q) = %+v", c.Key("tenant-42"), info)
		}
	}
}

// TestParsePolicyForms checks the short forms as people write them: any
// duration time.ParseDuration reads.
func TestParsePolicyForms(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want throttle.Policy
	}{
		{"gcra:10/1s:1", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1}},
		{"gcra:10/1000ms:1", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1}},
		{"tb:10/1s:5", throttle.TokenBucket{Rate: throttle.PerSecond(10), Burst: 5}},
		{"lb:10/1m0s:5", throttle.LeakyBucket{Rate: throttle.PerMinute(10), Capacity: 5}},
		{"lb:10/1m:5", throttle.LeakyBucket{Rate: throttle.PerMinute(10), Capacity: 5}},
		{"fw:25/1m0s", throttle.FixedWindow{Limit: 25, Window: time.Minute}},
		{"fw:25/60s", throttle.FixedWindow{Limit: 25, Window: time.Minute}},
		{"sl:25/1s", throttle.SlidingLog{Limit: 25, Window: time.Second}},
		{"sw:25/1s", throttle.SlidingWindow{Limit: 25, Window: time.Second}},
		{"sw:25/1.5s", throttle.SlidingWindow{Limit: 25, Window: 1500 * time.Millisecond}},
		{"gcra:1/1500us:1", throttle.GCRA{Rate: throttle.Rate{N: 1, Per: 1500 * time.Microsecond}, Burst: 1}},
		{"gcra:1/1.5ms:1", throttle.GCRA{Rate: throttle.Rate{N: 1, Per: 1500 * time.Microsecond}, Burst: 1}},
		// a bare unit, as the docs write rates
		{"gcra:10/s:5", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 5}},
		{"tb:10/s:5", throttle.TokenBucket{Rate: throttle.PerSecond(10), Burst: 5}},
		{"lb:600/h:5", throttle.LeakyBucket{Rate: throttle.PerHour(600), Capacity: 5}},
		{"fw:25/m", throttle.FixedWindow{Limit: 25, Window: time.Minute}},
		{"sl:25/s", throttle.SlidingLog{Limit: 25, Window: time.Second}},
		{"sw:3/ms", throttle.SlidingWindow{Limit: 3, Window: time.Millisecond}},
	} {
		got, err := throttle.ParsePolicy(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParsePolicy(%q) = %#v, %v; want %#v", tc.in, got, err, tc.want)
		}
	}
	got, err := throttle.ParseConcurrency("conc:3/30s")
	if want := (throttle.Concurrency{Limit: 3, Lease: 30 * time.Second}); err != nil || got != want {
		t.Errorf("ParseConcurrency(conc:3/30s) = %#v, %v", got, err)
	}
}

func TestParsePolicyRejects(t *testing.T) {
	for _, tc := range []struct {
		in, says string
	}{
		{"", "unknown kind"},
		{"gcra", "want N/PER:CAPACITY"},
		{"gcra:10/1s", "want N/PER:CAPACITY"},
		{"gcra:10:1", "want COUNT/DURATION"},
		{"gcra:10/1s:", "whole number"},
		{"gcra:ten/1s:1", "whole number"},
		{"gcra:+10/1s:1", "whole number"},
		{"gcra:-1/1s:1", "whole number"},
		{"gcra:10/1s:0", "Burst must be at least 1"},
		{"gcra:10/soon:1", "bad duration"},
		{"gcra:10/0s:1", "must be at least"},
		{"gcra:10/-1s:1", "must be at least"},
		{"gcra:10/1ns:1", "must be at least"},
		{"gcra:10/1s:1:2", "whole number"},
		{"gcra:99999999999999999999/1s:1", "out of range"},
		{"tb:0/1s:1", "N must be at least 1"},
		{"lb:1/1s:0", "Capacity must be at least 1"},
		{"fw:0/1s", "Limit must be at least 1"},
		{"fw:10/1s:5", "bad duration"},
		{"fw:10/1us", "must be at least 1ms"},
		{"sl:10/11y", "bad duration"},
		{"sl:10/100000h", "at most"},
		{"sw:10", "want COUNT/DURATION"},
		{"GCRA:10/1s:1", "unknown kind"},
		{" gcra:10/1s:1", "unknown kind"},
		{"conc:3/30s", "NewConcurrencyLimiter"},
		{"token-bucket:10/1s:5", "unknown kind"},
	} {
		p, err := throttle.ParsePolicy(tc.in)
		if !errors.Is(err, throttle.ErrInvalidPolicy) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("ParsePolicy(%q) = %#v, %v; want ErrInvalidPolicy saying %q", tc.in, p, err, tc.says)
		}
	}
	for _, in := range []string{"", "conc", "conc:3", "conc:0/30s", "conc:3/1ms", "conc:3/30s:1", "gcra:10/1s:1", "conc:3/thirty"} {
		if c, err := throttle.ParseConcurrency(in); !errors.Is(err, throttle.ErrInvalidPolicy) {
			t.Errorf("ParseConcurrency(%q) = %#v, %v; want ErrInvalidPolicy", in, c, err)
		}
	}
}

// TestParseKeyReadsWhatTheLibraryWrote creates state, blocks and tickets
// with real limiters, for caller keys that need escaping among others, and
// reads every key found under the prefix back to its limiter, caller key
// and kind: building the key again from what ParseKey read gives the key.
func TestParseKeyReadsWhatTheLibraryWrote(t *testing.T) {
	tg := redistest.New(t)
	ctx := context.Background()
	callers := []string{"tenant-42", "a{b}%c", "%7B", "}", "%", "a}:{b", "ünï:cödé", "%#" + strings.Repeat("0", 64)}
	limiters := map[string]*throttle.Limiter{}
	type found struct {
		name, caller string
		kind         keyspace.KeyKind
	}
	want := map[found]bool{}
	// Slow enough that nothing expires while the test runs on a real Redis.
	lasting := []throttle.Policy{
		throttle.GCRA{Rate: throttle.PerHour(10), Burst: 5},
		throttle.TokenBucket{Rate: throttle.Rate{N: 3, Per: 90 * time.Minute}, Burst: 2},
		throttle.LeakyBucket{Rate: throttle.PerMinute(10), Capacity: 5},
		throttle.FixedWindow{Limit: 1, Window: 10 * 365 * 24 * time.Hour},
		throttle.SlidingLog{Limit: 25, Window: time.Hour},
		throttle.SlidingWindow{Limit: 100, Window: 36 * time.Hour},
	}
	for _, p := range lasting {
		l := newLimiter(t, tg, p)
		id := l.Name()
		limiters[id] = l
		for _, caller := range callers {
			allowN(t, l, caller, 1)
			want[found{id, caller, keyspace.KeyState}] = true
		}
		if err := l.BlockFor(ctx, "blocked}", time.Minute); err != nil {
			t.Fatal(err)
		}
		want[found{id, "blocked}", keyspace.KeyBlock}] = true
		if l.CanReserveAhead() {
			r, err := l.ReserveFor(ctx, "booked", throttle.Ticket{ID: "task{7}%", Grace: 10 * time.Hour}, 1, time.Hour)
			if err != nil || !r.OK {
				t.Fatalf("ReserveFor: %+v, %v", r, err)
			}
			want[found{id, "booked", keyspace.KeyTicket}] = true
			want[found{id, "booked", keyspace.KeyTickets}] = true
		}
	}
	// A limiter with leased shares keeps its keys' state in their shares'
	// key (decided by the rest here: no process holds a share yet).
	leased, err := throttle.New(tg.Client, "leased", throttle.GCRA{Rate: throttle.PerHour(10), Burst: 5},
		throttle.WithPrefix(tg.Prefix), throttle.WithLeasedShares(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = leased.Close(ctx) })
	limiters[leased.Name()] = leased
	for _, caller := range callers {
		allowN(t, leased, caller, 1)
		want[found{leased.Name(), caller, keyspace.KeyShares}] = true
	}
	conc := newConcurrency(t, tg.Client, tg.Prefix, parseConcurrencies[0])
	lease, _, err := conc.Acquire(ctx, "exports{1}")
	if err != nil || lease == nil {
		t.Fatalf("Acquire: %v, %v", lease, err)
	}
	defer lease.Release(ctx)
	want[found{conc.Name(), "exports{1}", keyspace.KeyState}] = true

	for _, key := range tg.Keys(t) {
		info, err := throttle.ParseKey(tg.Prefix, key)
		if err != nil {
			t.Errorf("ParseKey(%q): %v", key, err)
			continue
		}
		delete(want, found{info.Name, info.Caller, info.Kind})
		var rebuilt string
		if info.Concurrency() {
			rebuilt = conc.Key(info.Caller)
		} else {
			rebuilt = limiters[info.Name].Key(info.Caller)
		}
		switch info.Kind {
		case keyspace.KeyBlock:
			rebuilt += ":block"
		case keyspace.KeyTickets:
			rebuilt += ":tickets"
		case keyspace.KeyShares:
			rebuilt += ":shares"
		case keyspace.KeyTicket:
			if info.Ticket != "task{7}%" {
				t.Errorf("ParseKey(%q): ticket %q", key, info.Ticket)
			}
			tag := keyspace.Tag(info.Ticket)
			rebuilt += ":t:" + tag[1:len(tag)-1]
		}
		if rebuilt != key || info.Hashed {
			t.Errorf("ParseKey(%q) = %+v, which builds %q", key, info, rebuilt)
		}
	}
	for w := range want {
		t.Errorf("no key found for %+v", w)
	}
}

// TestParseKeyHashed reads keys whose caller key is stored by its hash.
func TestParseKeyHashed(t *testing.T) {
	p := throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 5}
	l, err := throttle.New(parseClient, "l", p, throttle.WithKeyHashing(0))
	if err != nil {
		t.Fatal(err)
	}
	key := l.Key("alice@example.com")
	info, err := throttle.ParseKey(throttle.DefaultPrefix, key)
	if err != nil {
		t.Fatalf("ParseKey(%q): %v", key, err)
	}
	stored := key[strings.IndexByte(key, '{')+1 : len(key)-1]
	if !info.Hashed || info.Caller != stored || info.Name != "l" || info.Algorithm != "gcra" || len(stored) != keyspace.HashedLen {
		t.Errorf("ParseKey(%q) = %+v", key, info)
	}
	if info, err := throttle.ParseKey(throttle.DefaultPrefix, key+":block"); err != nil || info.Kind != keyspace.KeyBlock || !info.Hashed {
		t.Errorf("ParseKey(%q) = %+v, %v", key+":block", info, err)
	}
}

func TestParseKeyRejects(t *testing.T) {
	const prefix = "throttle:"
	hash := "%#" + strings.Repeat("ab", 32)
	for _, key := range []string{
		"",
		"other:api@gcra:{x}",                                // another prefix
		"throttle:api@gcra",                                 // no tag
		"throttle:api@gcra{x}",                              // no colon before the tag
		"throttle:{x}",                                      // no name
		"throttle:gcra:10/1s:5:{x}",                         // a policy, not a name (written before names were required)
		"throttle:api:{x}",                                  // no algorithm
		"throttle:@gcra:{x}",                                // empty name
		"throttle:api@GCRA:{x}",                             // unknown algorithm
		"throttle:api@gcra:{x",                              // unclosed tag
		"throttle:api@gcra:{}",                              // empty caller key
		"throttle:api@gcra:{a{b}",                           // brace inside the tag
		"throttle:api@gcra:{a%b}",                           // bare percent
		"throttle:api@gcra:{a%7b}",                          // lower-case escape
		"throttle:api@gcra:{a%2}",                           // short escape
		"throttle:api@gcra:{x}:other",                       // unknown suffix
		"throttle:api@gcra:{x}:t:",                          // empty ticket
		"throttle:api@gcra:{x}:t:a{b",                       // unescaped ticket
		"throttle:api@gcra:{x}:block:x",                     // block with more
		"throttle:api@fw:{x}:t:task",                        // windows keep no tickets
		"throttle:api@fw:{x}:shares",                        // nor shares
		"throttle:api@lb:{x}:t:task",                        // nor does the leaky bucket
		"throttle:pool@conc:{x}:block",                      // nor blocks for concurrency
		"throttle:worker:task:{task-1}",                     // the worker's give-up counter
		"throttle:sched:{nightly}:2026-03-14T02:00:00Z",     // a scheduler claim
		"throttle:policy:{api}",                             // stored policies
		"throttle:limiters",                                 // the registry of names
		"throttle:api@gcra:{" + hash[:len(hash)-1] + "}",    // hash too short
		"throttle:api@gcra:{" + strings.ToUpper(hash) + "}", // not lower-case hex
		"throttle:api@gcra:{" + hash + "0}",                 // hash too long
	} {
		if info, err := throttle.ParseKey(prefix, key); !errors.Is(err, keyspace.ErrNotLimiterKey) {
			t.Errorf("ParseKey(%q) = %+v, %v; want ErrNotLimiterKey", key, info, err)
		}
	}
	info, err := throttle.ParseKey("", "api@gcra:{x}")
	if err != nil || info.Caller != "x" || info.Name != "api" {
		t.Errorf("ParseKey with an empty prefix = %+v, %v", info, err)
	}
}

func FuzzParsePolicy(f *testing.F) {
	for _, p := range parsePolicies {
		f.Add(p.String())
	}
	for _, s := range []string{"conc:3/30s", "gcra:10/1.5ms:1", "fw:25/1m", "sw:1/1h1m1.000001s", "tb:1/1us:1", "lb:99/0s:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := throttle.ParsePolicy(s)
		if err != nil {
			if !errors.Is(err, throttle.ErrInvalidPolicy) {
				t.Fatalf("ParsePolicy(%q): %v does not wrap ErrInvalidPolicy", s, err)
			}
			c, err := throttle.ParseConcurrency(s)
			if err != nil {
				if !errors.Is(err, throttle.ErrInvalidPolicy) {
					t.Fatalf("ParseConcurrency(%q): %v does not wrap ErrInvalidPolicy", s, err)
				}
				return
			}
			if err := c.Validate(); err != nil {
				t.Fatalf("ParseConcurrency(%q) = %#v, invalid: %v", s, c, err)
			}
			form := fmt.Sprintf("conc:%d/%s", c.Limit, c.Lease)
			if again, err := throttle.ParseConcurrency(form); err != nil || again != c {
				t.Fatalf("ParseConcurrency(%q) = %#v, %v; want %#v", form, again, err, c)
			}
			return
		}
		if err := p.Validate(); err != nil {
			t.Fatalf("ParsePolicy(%q) = %#v, invalid: %v", s, p, err)
		}
		again, err := throttle.ParsePolicy(p.String())
		if err != nil || again.String() != p.String() {
			t.Fatalf("ParsePolicy(%q) = %#v, %v; want %#v (from %q)", p.String(), again, err, p, s)
		}
	})
}

// FuzzParseKey checks that ParseKey accepts only keys the library builds:
// whatever it reads builds the same key again.
func FuzzParseKey(f *testing.F) {
	const prefix = "p:"
	for _, key := range []string{
		"p:api@gcra:{tenant-42}",
		"p:api@gcra:{a%7Bb%7D%25c}:t:task%7B1%7D",
		"p:api@fw:{x}:block",
		"p:pool@conc:{exports}",
		"p:api@sw:{%#" + strings.Repeat("0f", 32) + "}",
		"p:worker:task:{x}",
	} {
		f.Add(key)
	}
	f.Fuzz(func(t *testing.T, key string) {
		info, err := throttle.ParseKey(prefix, key)
		if err != nil {
			if !errors.Is(err, keyspace.ErrNotLimiterKey) {
				t.Fatalf("ParseKey(%q): %v does not wrap ErrNotLimiterKey", key, err)
			}
			return
		}
		var rebuilt string
		if info.Concurrency() {
			cl, err := throttle.NewConcurrencyLimiter(parseClient, info.Name, throttle.Concurrency{Limit: 1, Lease: time.Second}, throttle.WithPrefix(prefix))
			if err != nil {
				t.Fatal(err)
			}
			rebuilt = cl.Key(info.Caller)
		} else {
			l, err := throttle.New(parseClient, info.Name, policyOfKind[info.Algorithm], throttle.WithPrefix(prefix))
			if err != nil {
				t.Fatalf("ParseKey(%q) = %+v: %v", key, info, err)
			}
			rebuilt = l.Key(info.Caller)
		}
		if info.Hashed {
			// The caller key is not in Redis; the stored form is.
			open := strings.IndexByte(rebuilt, '{')
			rebuilt = rebuilt[:open] + "{" + info.Caller + "}"
		}
		switch info.Kind {
		case keyspace.KeyBlock:
			rebuilt += ":block"
		case keyspace.KeyTickets:
			rebuilt += ":tickets"
		case keyspace.KeyTicket:
			tag := keyspace.Tag(info.Ticket)
			rebuilt += ":t:" + tag[1:len(tag)-1]
		}
		if rebuilt != key {
			t.Fatalf("ParseKey(%q) = %+v, which builds %q", key, info, rebuilt)
		}
	})
}

// policyOfKind is a policy of each algorithm, by its short name.
var policyOfKind = map[string]throttle.Policy{
	"gcra":  throttle.GCRA{Rate: throttle.PerSecond(1), Burst: 1},
	"tb":    throttle.TokenBucket{Rate: throttle.PerSecond(1), Burst: 1},
	"lb":    throttle.LeakyBucket{Rate: throttle.PerSecond(1), Capacity: 1},
	"fw":    throttle.FixedWindow{Limit: 1, Window: time.Second},
	"sl":    throttle.SlidingLog{Limit: 1, Window: time.Second},
	"sw":    throttle.SlidingWindow{Limit: 1, Window: time.Second},
	"quota": throttle.Quota{Limit: 1, Period: throttle.Day},
}

// TestPolicyStringReadsBack: every policy's String is its short form,
// which ParsePolicy reads back to the same policy.
func TestPolicyStringReadsBack(t *testing.T) {
	for _, tc := range []struct {
		policy throttle.Policy
		want   string
	}{
		{throttle.GCRA{Rate: throttle.PerMinute(10), Burst: 5}, "gcra:10/1m:5"},
		{throttle.TokenBucket{Rate: throttle.Rate{N: 3, Per: 90 * time.Minute}, Burst: 4}, "tb:3/1h30m:4"},
		{throttle.LeakyBucket{Rate: throttle.PerSecond(7), Capacity: 2}, "lb:7/1s:2"},
		{throttle.FixedWindow{Limit: 25, Window: 24 * time.Hour}, "fw:25/24h"},
		{throttle.SlidingLog{Limit: 3, Window: 1500 * time.Millisecond}, "sl:3/1.5s"},
		{throttle.SlidingWindow{Limit: 9, Window: 61 * time.Second}, "sw:9/1m1s"},
		{throttle.Quota{Limit: 1000, Period: throttle.Day, Location: mustZone(t, "Europe/Paris")}, "quota:1000/day:Europe/Paris"},
		{throttle.Quota{Limit: 5, Period: throttle.Month}, "quota:5/month:UTC"},
	} {
		if got := tc.policy.String(); got != tc.want {
			t.Errorf("%#v.String() = %q, want %q", tc.policy, got, tc.want)
		}
		back, err := throttle.ParsePolicy(tc.policy.String())
		if err != nil || back.String() != tc.policy.String() {
			t.Errorf("ParsePolicy(%q) = %#v, %v; want %#v", tc.policy.String(), back, err, tc.policy)
		}
	}
}

// TestParseKeyOfNamedLimiters: a named limiter's keys carry its name and
// algorithm, and read back to them.
func TestParseKeyOfNamedLimiters(t *testing.T) {
	tg := redistest.Embedded(t)
	l := newNamedLimiter(t, tg, "partner-api", throttle.GCRA{Rate: throttle.PerSecond(1), Burst: 1})
	info, err := throttle.ParseKey(tg.Prefix, l.Key("tenant{1}"))
	if err != nil || info.Name != "partner-api" || info.Algorithm != "gcra" || info.Caller != "tenant{1}" || info.Kind != keyspace.KeyState {
		t.Errorf("ParseKey(%q) = %+v, %v", l.Key("tenant{1}"), info, err)
	}
	for _, bad := range []string{"partner-api@nope:{t}", "@gcra:{t}", "a{b@gcra:{t}", "partner-api@lb:{t}:tickets"} {
		if _, err := throttle.ParseKey(tg.Prefix, tg.Prefix+bad); !errors.Is(err, keyspace.ErrNotLimiterKey) {
			t.Errorf("ParseKey(%q) = %v, want ErrNotLimiterKey", bad, err)
		}
	}
	for _, name := range []string{"", "a@b", "a{b", "a}b"} {
		if _, err := throttle.New(tg.Client, name, throttle.GCRA{Rate: throttle.PerSecond(1), Burst: 1}); !errors.Is(err, throttle.ErrInvalidOption) {
			t.Errorf("New with the name %q: %v, want ErrInvalidOption", name, err)
		}
		if _, err := throttle.NewConcurrencyLimiter(tg.Client, name, throttle.Concurrency{Limit: 1, Lease: time.Second}); !errors.Is(err, throttle.ErrInvalidOption) {
			t.Errorf("NewConcurrencyLimiter with the name %q: %v, want ErrInvalidOption", name, err)
		}
	}
}

// TestLimitersOfDifferentNamesShareNothing: two limiters of one policy
// with different names ("emails", "exports") keep their own budgets for
// the same caller key; two of one name (two processes, say) share one.
// Before names were required, two unnamed limiters of one policy shared
// their state: the second was refused.
func TestLimitersOfDifferentNamesShareNothing(t *testing.T) {
	tg := redistest.New(t)
	ctx := context.Background()
	p := throttle.GCRA{Rate: throttle.PerMinute(1), Burst: 1}
	emails := newNamedLimiter(t, tg, "emails", p)
	exports := newNamedLimiter(t, tg, "exports", p)
	emailsElsewhere := newNamedLimiter(t, tg, "emails", p)
	for _, step := range []struct {
		l    *throttle.Limiter
		what string
		want bool
	}{
		{emails, "emails", true},
		{exports, "exports, the same policy and caller key", true},
		{emailsElsewhere, "emails, from another limiter of the name", false},
		{exports, "exports again", false},
	} {
		if r := allowN(t, step.l, "share-tenant-42", 1); r.Allowed != step.want {
			t.Errorf("%s: allowed %v, want %v", step.what, r.Allowed, step.want)
		}
	}
	c := throttle.Concurrency{Limit: 1, Lease: time.Minute}
	pools := []*throttle.ConcurrencyLimiter{
		newNamedConcurrency(t, tg, "uploads", c), newNamedConcurrency(t, tg, "downloads", c), newNamedConcurrency(t, tg, "uploads", c),
	}
	for i, want := range []bool{true, true, false} {
		lease, _, err := pools[i].Acquire(ctx, "share-tenant-42")
		if err != nil {
			t.Fatal(err)
		}
		if got := lease != nil; got != want {
			t.Errorf("%s (the %d-th cap): acquired %v, want %v", pools[i].Name(), i+1, got, want)
		}
		if lease != nil {
			defer lease.Release(ctx)
		}
	}
}
