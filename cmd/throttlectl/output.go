package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
)

// jsonState is a key's state in --json output. Durations come twice: as Go
// durations ("1m30s") for people and in microseconds, the library's
// resolution, for programs.
type jsonState struct {
	Key      string `json:"key"`
	RedisKey string `json:"redis_key"`
	Limiter  string `json:"limiter"` // the limiter's name
	Policy   string `json:"policy"`  // the policy in force
	// PolicySource says where the policy comes from: "stored" (throttlectl
	// set), "code" (its processes, in the registry of names), "--policy"
	// or "--config".
	PolicySource string `json:"policy_source"`
	// Rules are the worker's rules that use the limiter, as its processes
	// recorded them in the registry of names.
	Rules []string `json:"rules"`
	Kind  string   `json:"kind"` // "rate" or "concurrency"
	// The policy's numbers; each is left out where the policy has none.
	Rate          string  `json:"rate,omitempty"`            // "10/1s"; a window's "25/1m"; a quota's "1000/day"
	RatePerSecond float64 `json:"rate_per_second,omitempty"` // the rate in units per second (on average, for a window)
	Burst         int     `json:"burst,omitempty"`           // GCRA, TokenBucket
	Capacity      int     `json:"capacity,omitempty"`        // LeakyBucket
	Window        string  `json:"window,omitempty"`          // FixedWindow, SlidingLog, SlidingWindow
	WindowUS      int64   `json:"window_us,omitempty"`
	Period        string  `json:"period,omitempty"` // Quota: "day" or "month"
	Lease         string  `json:"lease,omitempty"`  // concurrency caps
	LeaseUS       int64   `json:"lease_us,omitempty"`

	Throttled    bool   `json:"throttled"`
	Allowed      bool   `json:"allowed"`
	Limit        int    `json:"limit"`             // what Remaining counts down from: the burst, capacity, limit or slots
	Remaining    int    `json:"remaining"`         // units (free slots) left now
	Holders      *int   `json:"holders,omitempty"` // concurrency caps only
	RetryAfter   string `json:"retry_after"`
	RetryAfterUS int64  `json:"retry_after_us"`
	ResetAfter   string `json:"reset_after"`
	ResetAfterUS int64  `json:"reset_after_us"`
	BlockedFor   string `json:"blocked_for"`
	BlockedForUS int64  `json:"blocked_for_us"`
	// The worker's tasks in the key's waiting room, by flow, and when the
	// last is expected to start (a TokenBucket or GCRA key).
	Waiting        int        `json:"waiting"`
	ExpectedWait   string     `json:"expected_wait"`
	ExpectedWaitUS int64      `json:"expected_wait_us"`
	Flows          []jsonFlow `json:"flows"`
	// Shares: the key's rate leased to processes (a limiter with leased
	// shares only).
	Shares *jsonShares `json:"shares,omitempty"`
}

// jsonShares is a key's leased shares and their rest, in --json output.
type jsonShares struct {
	// The rest: what the shares leave, which Redis decides for processes
	// holding none.
	RestRatePerSecond float64     `json:"rest_rate_per_second"`
	RestBurst         float64     `json:"rest_burst"`
	RestTokens        float64     `json:"rest_tokens"`
	Holders           []jsonShare `json:"holders"`
}

// jsonShare is one process's share, in --json output.
type jsonShare struct {
	Holder          string  `json:"holder"` // host/pid/random
	RatePerSecond   float64 `json:"rate_per_second"`
	Burst           float64 `json:"burst"`
	EndsIn          string  `json:"ends_in"` // until its lease ends (renewed every half lease)
	EndsInUS        int64   `json:"ends_in_us"`
	DemandPerSecond float64 `json:"demand_per_second"` // what it asked for
}

// jsonFlow is one flow of a waiting room, in --json output.
type jsonFlow struct {
	Flow           string `json:"flow"`
	Waiting        int    `json:"waiting"`
	First          int    `json:"first"` // the place of its first waiter, 1: next
	ExpectedWait   string `json:"expected_wait"`
	ExpectedWaitUS int64  `json:"expected_wait_us"`
}

func toJSON(s state) jsonState {
	j := jsonState{
		Key:          s.caller,
		RedisKey:     s.redisKey,
		Limiter:      s.name,
		Policy:       s.policy,
		PolicySource: s.source,
		Rules:        append([]string{}, s.rules...),
		Kind:         "rate",
		Throttled:    s.throttled(),
		Allowed:      s.allowed,
		Limit:        s.limit,
		Remaining:    s.remaining,
		RetryAfter:   s.retryAfter.String(),
		RetryAfterUS: s.retryAfter.Microseconds(),
		ResetAfter:   s.resetAfter.String(),
		ResetAfterUS: s.resetAfter.Microseconds(),
		BlockedFor:   s.blockedFor.String(),
		BlockedForUS: s.blockedFor.Microseconds(),

		Waiting:        s.waiting,
		ExpectedWait:   s.expectedWait.String(),
		ExpectedWaitUS: s.expectedWait.Microseconds(),
		Flows:          []jsonFlow{},

		Rate:          s.limits.rate,
		RatePerSecond: s.limits.perSecond,
		Burst:         s.limits.burst,
		Capacity:      s.limits.capacity,
		Period:        s.limits.period,
	}
	if st := s.shares; st != nil {
		j.Shares = &jsonShares{RestRatePerSecond: st.RestRate, RestBurst: st.RestBurst, RestTokens: st.RestTokens, Holders: []jsonShare{}}
		for _, h := range st.Holders {
			in := max(0, h.Ends.Sub(st.At))
			j.Shares.Holders = append(j.Shares.Holders, jsonShare{Holder: h.ID, RatePerSecond: h.Rate, Burst: h.Burst,
				EndsIn: in.String(), EndsInUS: in.Microseconds(), DemandPerSecond: h.Demand})
		}
	}
	for _, f := range s.flows {
		wait := time.Duration(f.ExpectedWaitMs) * time.Millisecond
		j.Flows = append(j.Flows, jsonFlow{Flow: f.Flow, Waiting: f.Waiting, First: f.First, ExpectedWait: wait.String(), ExpectedWaitUS: wait.Microseconds()})
	}
	if w := s.limits.window; w > 0 {
		j.Window, j.WindowUS = w.String(), w.Microseconds()
	}
	if l := s.limits.lease; l > 0 {
		j.Lease, j.LeaseUS = l.String(), l.Microseconds()
	}
	if s.concurrency {
		j.Kind = "concurrency"
		holders := s.holders()
		j.Holders = &holders
	}
	return j
}

// writeJSON writes v as one indented JSON document.
func (a *app) writeJSON(v any) error {
	enc := json.NewEncoder(a.stdout)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// writePeek writes one key's state: a table of one row, or a JSON object.
func (a *app) writePeek(s state) error {
	if a.json {
		return a.writeJSON(toJSON(s))
	}
	tw := newTable(a.stdout)
	if s.concurrency {
		row(tw, "KEY", "LIMITER", "POLICY", "FROM", "ALLOWED", "HOLDERS", "FREE", "RETRY-AFTER", "RESET-AFTER")
		row(tw, display(s.caller), display(s.name), s.policy, s.source, yesNo(s.allowed), fraction(s.holders(), s.limit),
			strconv.Itoa(s.remaining), short(s.retryAfter), short(s.resetAfter))
	} else {
		headers, cells := s.limits.columns()
		row(tw, "KEY", "LIMITER", "POLICY", "FROM", headers[0], headers[1], "ALLOWED", "REMAINING", "RETRY-AFTER", "RESET-AFTER", "BLOCKED-FOR")
		row(tw, display(s.caller), display(s.name), s.policy, s.source, cells[0], cells[1], yesNo(s.allowed), fraction(s.remaining, s.limit),
			short(s.retryAfter), short(s.resetAfter), short(s.blockedFor))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(s.rules) > 0 {
		fmt.Fprintf(a.stdout, "The worker's rules using %s: %s.\n", display(s.name), strings.Join(s.rules, ", "))
	}
	if err := a.writeShares(s); err != nil {
		return err
	}
	return a.writeWaiting(s)
}

// writeShares writes a key's leased shares under its peek: each holder's
// share and lease, and the rest Redis decides.
func (a *app) writeShares(s state) error {
	st := s.shares
	if st == nil {
		return nil
	}
	fmt.Fprintf(a.stdout, "\n%d processes hold shares of the key's rate; Redis decides the rest for the others: %s/s, burst %s (%s left).\n",
		len(st.Holders), decimal(st.RestRate), decimal(st.RestBurst), decimal(st.RestTokens))
	if len(st.Holders) == 0 {
		return nil
	}
	tw := newTable(a.stdout)
	row(tw, "HOLDER", "RATE", "BURST", "LEASE-ENDS-IN", "ASKED")
	for _, h := range st.Holders {
		row(tw, display(h.ID), decimal(h.Rate)+"/s", decimal(h.Burst), short(max(0, h.Ends.Sub(st.At))), decimal(h.Demand)+"/s")
	}
	return tw.Flush()
}

// decimal writes x with at most two decimals, without trailing zeros.
func decimal(x float64) string { return strconv.FormatFloat(math.Round(x*100)/100, 'f', -1, 64) }

// writeWaiting writes a key's waiting room under its peek: how many tasks
// wait, when the last is expected to start, and each flow's tasks, the
// place of its first and when its last is expected to start.
func (a *app) writeWaiting(s state) error {
	if s.waiting == 0 {
		return nil
	}
	fmt.Fprintf(a.stdout, "\n%d tasks wait in the key's waiting room; the last is expected to start in %s.\n", s.waiting, short(s.expectedWait))
	tw := newTable(a.stdout)
	row(tw, "FLOW", "WAITING", "FIRST-AT", "LAST-STARTS-IN")
	for _, f := range s.flows {
		row(tw, display(f.Flow), strconv.Itoa(f.Waiting), strconv.Itoa(f.First), short(time.Duration(f.ExpectedWaitMs)*time.Millisecond))
	}
	return tw.Flush()
}

// writeReset reports a reset and the state it forgot.
func (a *app) writeReset(before state) error {
	if a.json {
		return a.writeJSON(struct {
			Reset bool `json:"reset"`
			jsonState
		}{!before.absent, toJSON(before)})
	}
	if before.absent {
		_, err := fmt.Fprintf(a.stdout, "nothing to reset: %s of the limiter %s, %s, has no state in Redis (Redis key %s): it is full, %s remaining\n",
			display(before.caller), display(before.name), before.policy, display(before.redisKey), fraction(before.remaining, before.limit))
		return err
	}
	_, err := fmt.Fprintf(a.stdout, "reset %s of the limiter %s, %s (%s; Redis key %s); it had %s remaining, retry-after %s, blocked-for %s\n",
		display(before.caller), display(before.name), before.policy, before.limits.describe(), display(before.redisKey), fraction(before.remaining, before.limit), short(before.retryAfter), short(before.blockedFor))
	return err
}

// writeTop writes top's listing: a table, or a JSON array.
func (a *app) writeTop(states []state, f found) error {
	if f.unknown > 0 {
		fmt.Fprintf(a.stderr, "throttlectl: note: %d keys of limiters whose policy is not known (none in the registry of names, none stored, none in --config) were not peeked\n", f.unknown)
	}
	if f.hashed > 0 {
		fmt.Fprintf(a.stderr, "throttlectl: note: %d keys under the prefix store their caller key by hash (WithKeyHashing) and were not peeked\n", f.hashed)
	}
	if a.json {
		list := make([]jsonState, len(states))
		for i, s := range states {
			list[i] = toJSON(s)
		}
		return a.writeJSON(list)
	}
	if len(states) == 0 {
		_, err := fmt.Fprintf(a.stdout, "no key throttled now under the prefix %q (%d limiter keys of %d keys scanned)\n", a.prefix, len(f.keys), f.scanned)
		return err
	}
	tw := newTable(a.stdout)
	row(tw, "KEY", "LIMITER", "POLICY", "FROM", "RATE", "BURST", "REMAINING", "RETRY-AFTER", "RESET-AFTER", "BLOCKED-FOR", "WAITING", "RULES")
	for _, s := range states {
		blocked := short(s.blockedFor)
		if s.concurrency {
			blocked = "-"
		}
		row(tw, display(s.caller), display(s.name), s.policy, s.source, s.limits.rateCell(), s.limits.burstCell(), fraction(s.remaining, s.limit),
			short(s.retryAfter), short(s.resetAfter), blocked, waitingCell(s), rulesCell(s))
	}
	return tw.Flush()
}

// waitingCell shows the tasks in a key's waiting room and when the last is
// expected to start ("357/35.7s"), or "-".
func waitingCell(s state) string {
	if s.waiting == 0 {
		return "-"
	}
	return strconv.Itoa(s.waiting) + "/" + short(s.expectedWait)
}

// rulesCell shows the worker's rules that use a key's limiter, as its
// processes recorded them in the registry of names ("tenant,overall"), or
// "-" when none did.
func rulesCell(s state) string {
	if len(s.rules) == 0 {
		return "-"
	}
	cells := make([]string, len(s.rules))
	for i, r := range s.rules {
		cells[i] = display(r)
	}
	return strings.Join(cells, ",")
}

func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

func row(w io.Writer, cells ...string) { fmt.Fprintln(w, strings.Join(cells, "\t")) }

// display returns a key as a table shows it: as it is when it is plain
// printable text without spaces, else quoted, so that no key can break the
// table's columns or the terminal.
func display(s string) string {
	for _, r := range s {
		if !unicode.IsGraphic(r) || unicode.IsSpace(r) || r == '"' || r == unicode.ReplacementChar {
			return strconv.Quote(s)
		}
	}
	if s == "" {
		return `""`
	}
	return s
}

// short returns d for a table: rounded up to the millisecond, so that a
// wait is never shown shorter than it is (JSON has it to the microsecond).
func short(d time.Duration) string {
	if rest := d % time.Millisecond; rest > 0 {
		d += time.Millisecond - rest
	}
	return d.String()
}

func fraction(n, of int) string { return strconv.Itoa(n) + "/" + strconv.Itoa(of) }

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
