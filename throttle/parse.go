package throttle

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keyspace"
)

// This file reads back what the library writes: policies in the short form
// they take inside Redis keys, and the Redis keys themselves. Operations
// tools (cmd/throttlectl) use it to name a policy on a command line and to
// tell which limiter and caller key a scanned Redis key belongs to.

// ParsePolicy reads a policy in the short form the library writes inside
// its Redis keys:
//
//	gcra:N/PER:BURST     GCRA{Rate: Rate{N, PER}, Burst: BURST}
//	tb:N/PER:BURST       TokenBucket{Rate: Rate{N, PER}, Burst: BURST}
//	lb:N/PER:CAPACITY    LeakyBucket{Rate: Rate{N, PER}, Capacity: CAPACITY}
//	fw:LIMIT/WINDOW      FixedWindow{Limit: LIMIT, Window: WINDOW}
//	sl:LIMIT/WINDOW      SlidingLog{Limit: LIMIT, Window: WINDOW}
//	sw:LIMIT/WINDOW      SlidingWindow{Limit: LIMIT, Window: WINDOW}
//	quota:LIMIT/day:ZONE Quota{Limit: LIMIT, Period: Day, Location: ZONE}
//	quota:LIMIT/month:ZONE
//
// A quota's ZONE is an IANA time zone name such as "Europe/Paris", read
// with [time.LoadLocation]; ":ZONE" may be left out for UTC.
//
// PER and WINDOW are durations as [time.ParseDuration] reads them, or a
// bare unit as rates are written in prose: "gcra:10/s:5" is "gcra:10/1s:5",
// and "fw:25/m", "fw:25/1m" and the key's own "fw:25/1m0s" are the same
// policy. What [Policy.String] prints and the form of a policy in its keys
// always read back to that policy, so a policy can come from a
// configuration file or a flag. A concurrency policy ("conc:3/30s") is not
// a Policy but a [Concurrency]. The policy is validated; errors wrap
// [ErrInvalidPolicy].
func ParsePolicy(s string) (Policy, error) {
	kind, rest, _ := strings.Cut(s, ":")
	var p Policy
	var err error
	switch kind {
	case "gcra", "tb", "lb":
		var r Rate
		var capacity int
		if r, capacity, err = parseMeter(rest); err == nil {
			switch kind {
			case "gcra":
				p = GCRA{Rate: r, Burst: capacity}
			case "tb":
				p = TokenBucket{Rate: r, Burst: capacity}
			default:
				p = LeakyBucket{Rate: r, Capacity: capacity}
			}
		}
	case "fw", "sl", "sw":
		var limit int
		var window time.Duration
		if limit, window, err = parseCount(rest); err == nil {
			switch kind {
			case "fw":
				p = FixedWindow{Limit: limit, Window: window}
			case "sl":
				p = SlidingLog{Limit: limit, Window: window}
			default:
				p = SlidingWindow{Limit: limit, Window: window}
			}
		}
	case "quota":
		var q Quota
		if q, err = parseQuota(rest); err == nil {
			p = q
		}
	case "conc":
		return nil, fmt.Errorf("%w: %q is a concurrency policy, not a Policy: give NewConcurrencyLimiter a Concurrency", ErrInvalidPolicy, s)
	default:
		return nil, fmt.Errorf("%w: %q: unknown kind %q, want gcra, tb, lb, fw, sl, sw or quota", ErrInvalidPolicy, s, kind)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %w", ErrInvalidPolicy, s, err)
	}
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("%w (in %q)", err, s)
	}
	return p, nil
}

// parseConcurrency reads a concurrency policy in the form a
// [ConcurrencyLimiter] writes inside its Redis keys, "conc:LIMIT/LEASE",
// for example "conc:3/30s" for Concurrency{Limit: 3, Lease: 30 * time.Second}.
// LEASE is read by [time.ParseDuration]. The policy is validated; errors
// wrap [ErrInvalidPolicy].
func parseConcurrency(s string) (Concurrency, error) {
	rest, ok := strings.CutPrefix(s, "conc:")
	if !ok {
		return Concurrency{}, fmt.Errorf("%w: %q: a concurrency policy starts with \"conc:\"", ErrInvalidPolicy, s)
	}
	limit, lease, err := parseCount(rest)
	if err != nil {
		return Concurrency{}, fmt.Errorf("%w: %q: %w", ErrInvalidPolicy, s, err)
	}
	p := Concurrency{Limit: limit, Lease: lease}
	if err := p.Validate(); err != nil {
		return Concurrency{}, fmt.Errorf("%w (in %q)", err, s)
	}
	return p, nil
}

// parseMeter reads "N/PER:CAPACITY".
func parseMeter(s string) (Rate, int, error) {
	rate, capacity, ok := strings.Cut(s, ":")
	if !ok {
		return Rate{}, 0, errors.New("want N/PER:CAPACITY, e.g. 10/1s:5")
	}
	n, per, err := parseCount(rate)
	if err != nil {
		return Rate{}, 0, err
	}
	c, err := parseInt(capacity)
	if err != nil {
		return Rate{}, 0, err
	}
	return Rate{N: n, Per: per}, c, nil
}

// parseCount reads "COUNT/DURATION".
func parseCount(s string) (int, time.Duration, error) {
	count, span, ok := strings.Cut(s, "/")
	if !ok {
		return 0, 0, fmt.Errorf("want COUNT/DURATION, e.g. 10/1s, got %q", s)
	}
	n, err := parseInt(count)
	if err != nil {
		return 0, 0, err
	}
	if span != "" && span[0] >= 'a' && span[0] <= 'z' {
		span = "1" + span // a bare unit, as rates are written: 10/s is 10/1s
	}
	d, err := time.ParseDuration(span)
	if err != nil {
		return 0, 0, fmt.Errorf("bad duration %q", span)
	}
	return n, d, nil
}

// parseInt reads a decimal integer, digits only.
func parseInt(s string) (int, error) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, fmt.Errorf("want a whole number, got %q", s)
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("number %q out of range", s)
	}
	return n, nil
}

func init() {
	keyspace.Parse = parseKey
	keyspace.Inspecting = optionFunc(func(c *config) error {
		c.inspecting = true
		return nil
	})
	keyspace.ParseConcurrency = func(s string) (int, time.Duration, error) {
		p, err := parseConcurrency(s)
		return p.Limit, p.Lease, err
	}
}

// parseKey is [keyspace.Parse]: it accepts exactly the keys the library
// writes: the policy in the form the library gives it, a caller key escaped
// as the library escapes it (or hashed), and only the suffixes the policy
// uses. Any other key, such as the worker's and the scheduler's keys under
// the same prefix, is an error wrapping keyspace.ErrNotLimiterKey.
func parseKey(prefix, key string) (keyspace.KeyInfo, error) {
	rest, ok := strings.CutPrefix(key, prefix)
	if !ok {
		return keyspace.KeyInfo{}, notLimiterKey(key, "it does not start with the prefix %q", prefix)
	}
	open := strings.IndexByte(rest, '{')
	if open < 1 || rest[open-1] != ':' {
		return keyspace.KeyInfo{}, notLimiterKey(key, "no \":{\" after the limiter's name")
	}
	length := strings.IndexByte(rest[open+1:], '}')
	if length < 0 {
		return keyspace.KeyInfo{}, notLimiterKey(key, "the hash tag is not closed")
	}
	var info keyspace.KeyInfo
	at := strings.LastIndexByte(rest[:open-1], '@')
	if at >= 0 {
		info.Name, info.Algorithm = rest[:at], rest[at+1:open-1]
	}
	if at < 0 || validName(info.Name) != nil || kindName(info.Algorithm) == info.Algorithm {
		return keyspace.KeyInfo{}, notLimiterKey(key, "%q is not a limiter's name and algorithm as the library writes them", rest[:open-1])
	}
	stored := rest[open+1 : open+1+length]
	suffix := rest[open+2+length:]

	if keyspace.IsHashed(stored) {
		info.Caller, info.Hashed = stored, true
	} else if info.Caller, ok = keyspace.Unescape(stored); !ok || info.Caller == "" {
		return keyspace.KeyInfo{}, notLimiterKey(key, "the caller key %q is not escaped as the library escapes it", stored)
	}

	switch {
	case suffix == "":
		info.Kind = keyspace.KeyState
	case suffix == keyspace.BlockSuffix:
		info.Kind = keyspace.KeyBlock
	case suffix == keyspace.TicketsSuffix:
		info.Kind = keyspace.KeyTickets
	case suffix == keyspace.SharesSuffix:
		info.Kind = keyspace.KeyShares
	case strings.HasPrefix(suffix, keyspace.TicketInfix):
		info.Kind = keyspace.KeyTicket
		info.Ticket, ok = keyspace.Unescape(suffix[len(keyspace.TicketInfix):])
		if !ok || info.Ticket == "" {
			return keyspace.KeyInfo{}, notLimiterKey(key, "bad ticket %q", suffix[len(keyspace.TicketInfix):])
		}
	default:
		return keyspace.KeyInfo{}, notLimiterKey(key, "unknown suffix %q", suffix)
	}

	if info.Concurrency() && info.Kind != keyspace.KeyState {
		return keyspace.KeyInfo{}, notLimiterKey(key, "a concurrency limiter keeps no %s keys", info.Kind)
	}
	if (info.Kind == keyspace.KeyTicket || info.Kind == keyspace.KeyTickets || info.Kind == keyspace.KeyShares) && info.Algorithm != "gcra" && info.Algorithm != "tb" {
		return keyspace.KeyInfo{}, notLimiterKey(key, "%s keeps no %s keys", kindName(info.Algorithm), info.Kind)
	}
	return info, nil
}

func notLimiterKey(key, format string, args ...any) error {
	return fmt.Errorf("%w: %q: "+format, append([]any{keyspace.ErrNotLimiterKey, key}, args...)...)
}
