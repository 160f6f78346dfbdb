package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jobthrottle/jobthrottle/internal/scan"
	"github.com/redis/go-redis/v9"
)

// This file is the note peek and reset print for a key Redis holds no
// state for under the limiter asked for (it is full), which names the
// limiters that do hold state for that caller key.

// noStateError is a caller key with no state under the limiter asked for.
type noStateError struct {
	limiter  string   // the policy as Policy.String prints it, or name@algorithm
	caller   string   // the caller key
	redisKey string   // where its state would be
	prefix   string   // the --prefix looked under
	others   []string // the limiters holding state for caller, sorted
	lookup   error    // why others could not be looked for, or nil
}

func (e *noStateError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "no state for %s key %s (Redis key %s): it is full", e.limiter, strconv.Quote(e.caller), strconv.Quote(e.redisKey))
	switch {
	case e.lookup != nil:
		fmt.Fprintf(&b, "; looking for state under other policies failed: %v", e.lookup)
	case len(e.others) > 0:
		fmt.Fprintf(&b, "; state present under: %s", strings.Join(e.others, ", "))
	default:
		fmt.Fprintf(&b, ": no limiter under the prefix %s holds state for this key: it has not been limited lately, or under another --prefix", strconv.Quote(e.prefix))
	}
	return b.String()
}

// Unwrap returns the failure of the search for other limiters, if any.
func (e *noStateError) Unwrap() error { return e.lookup }

// errNoState returns the failure of peek and reset on caller, which has no
// state under l, listing the limiters that hold state for caller under the
// prefix: SCAN (never KEYS) on every master, matching caller's hash tag.
func (a *app) errNoState(client redis.UniversalClient, l *limiter, caller string) error {
	e := &noStateError{limiter: l.id, caller: caller, redisKey: l.key(caller), prefix: a.prefix}
	e.others, e.lookup = a.limitersHolding(client, l, caller)
	return e
}

// limitersHolding returns the limiters other than l that hold a key of
// caller under the prefix, by their policies, or name@algorithm for named
// limiters.
func (a *app) limitersHolding(client redis.UniversalClient, l *limiter, caller string) ([]string, error) {
	key := l.key(caller)
	open := strings.LastIndex(key, ":{")
	if open < 0 || !strings.HasSuffix(key, "}") {
		return nil, fmt.Errorf("cannot find the caller key in the Redis key %q", key)
	}
	tag := key[open+2 : len(key)-1] // the caller key as the keys store it
	pattern := scan.GlobEscape(a.prefix) + "*:{" + scan.GlobEscape(tag) + "}*"
	keys, err := a.scanMatch(context.Background(), client, pattern)
	if err != nil {
		return nil, err
	}
	var others []string
	for _, k := range keys {
		info, err := parseKey(a.prefix, k)
		if err != nil || info.Caller != caller || info.Hashed {
			continue
		}
		if limiterID(info) == l.id {
			continue
		}
		if label := limiterLabel(info); !slices.Contains(others, label) {
			others = append(others, label)
		}
	}
	slices.Sort(others)
	return others, nil
}

// limiterLabel names a key's limiter as peek shows it: name@algorithm, as
// its keys do.
func limiterLabel(info keyInfo) string { return limiterID(info) }
