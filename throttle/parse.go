package throttle

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
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
// PER and WINDOW are durations as [time.ParseDuration] reads them, so
// "fw:25/1m" and the key's own "fw:25/1m0s" are the same policy. The form
// of a policy in its keys always reads back to that policy. A concurrency
// policy ("conc:3/30s") is not a Policy: read it with [ParseConcurrency].
// The policy is validated; errors wrap [ErrInvalidPolicy].
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
		return nil, fmt.Errorf("%w: %q is a concurrency policy, read by ParseConcurrency", ErrInvalidPolicy, s)
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

// ParseConcurrency reads a concurrency policy in the form a
// [ConcurrencyLimiter] writes inside its Redis keys, "conc:LIMIT/LEASE",
// for example "conc:3/30s" for Concurrency{Limit: 3, Lease: 30 * time.Second}.
// LEASE is read by [time.ParseDuration]. The policy is validated; errors
// wrap [ErrInvalidPolicy].
func ParseConcurrency(s string) (Concurrency, error) {
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

// KeyKind says which of a limiter's keys a Redis key is.
type KeyKind int

const (
	// KeyState holds a caller key's state: what Peek and Allow read.
	KeyState KeyKind = iota
	// KeyBlock holds a caller key's block (Limiter.BlockFor), "…:block".
	KeyBlock
	// KeyTicket holds one ticket's booking (Limiter.ReserveFor), "…:t:<id>".
	KeyTicket
	// KeyTickets holds the generation of a caller key's tickets,
	// "…:tickets": Reset deletes it, and every ticket with it.
	KeyTickets
)

// String returns "state", "block", "ticket" or "tickets".
func (k KeyKind) String() string {
	switch k {
	case KeyState:
		return "state"
	case KeyBlock:
		return "block"
	case KeyTicket:
		return "ticket"
	case KeyTickets:
		return "tickets"
	}
	return fmt.Sprintf("KeyKind(%d)", int(k))
}

// KeyInfo is what [ParseKey] reads from a limiter's Redis key.
type KeyInfo struct {
	// Policy is the policy's short form as written in the key of a limiter
	// without a name, such as "gcra:10/1s:5" or "conc:3/30s".
	// [ParsePolicy] reads it back, or [ParseConcurrency] when Concurrency
	// reports true. Empty for a named limiter's key.
	Policy string
	// Name is the name of a limiter created with WithName, whose keys
	// carry its name and algorithm rather than its policy; else "".
	Name string
	// Algorithm is the policy's algorithm in short: "gcra", "tb", "lb",
	// "fw", "sl", "sw" or "conc".
	Algorithm string
	// Caller is the caller key, with the key's escaping undone. For a
	// caller key stored by its hash (WithKeyHashing), Caller is that stored
	// form, "%#" and 64 hex digits, and Hashed is true.
	Caller string
	// Hashed reports a caller key stored by its hash: the caller key itself
	// is not in Redis.
	Hashed bool
	// Kind says whether the key holds the state, the block or a ticket.
	Kind KeyKind
	// Ticket is a KeyTicket's ticket ID, its escaping undone; else "".
	Ticket string
}

// Concurrency reports whether the key belongs to a [ConcurrencyLimiter].
func (k KeyInfo) Concurrency() bool { return k.Algorithm == "conc" }

// ParseKey takes apart a Redis key that a [Limiter] or [ConcurrencyLimiter]
// with the given prefix wrote: prefix + policy + ":{" + caller key + "}",
// then nothing (the state), ":block", ":tickets" or ":t:" + ticket. It accepts exactly
// the keys the library writes: the policy in the form the library gives it,
// a caller key escaped as the library escapes it (or hashed), and only the
// suffixes the policy uses. Any other key, such as the worker's and the
// scheduler's keys under the same prefix, is an error wrapping
// [ErrNotLimiterKey].
func ParseKey(prefix, key string) (KeyInfo, error) {
	rest, ok := strings.CutPrefix(key, prefix)
	if !ok {
		return KeyInfo{}, notLimiterKey(key, "it does not start with the prefix %q", prefix)
	}
	open := strings.IndexByte(rest, '{')
	if open < 1 || rest[open-1] != ':' {
		return KeyInfo{}, notLimiterKey(key, "no \":{\" after the policy")
	}
	length := strings.IndexByte(rest[open+1:], '}')
	if length < 0 {
		return KeyInfo{}, notLimiterKey(key, "the hash tag is not closed")
	}
	info := KeyInfo{Policy: rest[:open-1]}
	if at := strings.LastIndexByte(info.Policy, '@'); at >= 0 {
		info.Name, info.Algorithm, info.Policy = info.Policy[:at], info.Policy[at+1:], ""
		if validName(info.Name) != nil || kindName(info.Algorithm) == info.Algorithm {
			return KeyInfo{}, notLimiterKey(key, "%q is not a limiter's name and algorithm as the library writes them", rest[:open-1])
		}
	} else {
		info.Algorithm, _, _ = strings.Cut(info.Policy, ":")
	}
	stored := rest[open+1 : open+1+length]
	suffix := rest[open+2+length:]

	if isHashedKey(stored) {
		info.Caller, info.Hashed = stored, true
	} else if info.Caller, ok = unescapeKey(stored); !ok || info.Caller == "" {
		return KeyInfo{}, notLimiterKey(key, "the caller key %q is not escaped as the library escapes it", stored)
	}

	switch {
	case suffix == "":
		info.Kind = KeyState
	case suffix == blockSuffix:
		info.Kind = KeyBlock
	case suffix == ticketsSuffix:
		info.Kind = KeyTickets
	case strings.HasPrefix(suffix, ticketSuffixText):
		info.Kind = KeyTicket
		info.Ticket, ok = unescapeKey(suffix[len(ticketSuffixText):])
		if !ok || info.Ticket == "" {
			return KeyInfo{}, notLimiterKey(key, "bad ticket %q", suffix[len(ticketSuffixText):])
		}
	default:
		return KeyInfo{}, notLimiterKey(key, "unknown suffix %q", suffix)
	}

	if info.Concurrency() {
		c, err := ParseConcurrency(info.Policy)
		if err != nil || concurrencyID(c) != info.Policy {
			return KeyInfo{}, notLimiterKey(key, "%q is not a concurrency policy as the library writes it", info.Policy)
		}
		if info.Kind != KeyState {
			return KeyInfo{}, notLimiterKey(key, "a concurrency limiter keeps no %s keys", info.Kind)
		}
		return info, nil
	}
	if info.Name == "" {
		p, err := ParsePolicy(info.Policy)
		if err != nil || p.spec().id != info.Policy {
			return KeyInfo{}, notLimiterKey(key, "%q is not a policy as the library writes it", info.Policy)
		}
	}
	if (info.Kind == KeyTicket || info.Kind == KeyTickets) && info.Algorithm != "gcra" && info.Algorithm != "tb" {
		return KeyInfo{}, notLimiterKey(key, "%s keeps no tickets", kindName(info.Algorithm))
	}
	return info, nil
}

func notLimiterKey(key, format string, args ...any) error {
	return fmt.Errorf("%w: %q: "+format, append([]any{ErrNotLimiterKey, key}, args...)...)
}

// ticketSuffixText is what ticketKey puts between a state key and the
// ticket; the tests check both agree.
const ticketSuffixText = ":t:"

// concurrencyID is the short form a ConcurrencyLimiter writes for p.
func concurrencyID(p Concurrency) string { return fmt.Sprintf("conc:%d/%s", p.Limit, p.Lease) }

// isHashedKey reports a caller key stored by its hash (see stored in
// keys.go): the mark and the SHA-256 in lowercase hex. An escaped key never
// starts with the mark, since '%' is always escaped to "%25".
func isHashedKey(stored string) bool {
	digits, ok := strings.CutPrefix(stored, hashedKeyMark)
	if !ok || len(stored) != HashedKeyLen {
		return false
	}
	for i := 0; i < len(digits); i++ {
		if c := digits[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// unescapeKey undoes the escaping of caller keys and tickets ('%' to
// "%25", '{' to "%7B", '}' to "%7D"). It accepts only what the escaping
// produces, so that escaping the result gives back stored exactly: no bare
// brace, and no '%' but in those three sequences.
func unescapeKey(stored string) (string, bool) {
	if !strings.ContainsAny(stored, "%{}") {
		return stored, true
	}
	var b strings.Builder
	b.Grow(len(stored))
	for i := 0; i < len(stored); i++ {
		switch c := stored[i]; c {
		case '{', '}':
			return "", false
		case '%':
			if i+3 > len(stored) {
				return "", false
			}
			switch stored[i+1 : i+3] {
			case "25":
				b.WriteByte('%')
			case "7B":
				b.WriteByte('{')
			case "7D":
				b.WriteByte('}')
			default:
				return "", false
			}
			i += 2
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), true
}
