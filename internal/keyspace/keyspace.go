// Package keyspace is the layout of the Redis keys jobthrottle writes:
// hash tags, the escaping of caller keys, and the reading of a limiter's
// key back, for throttlectl. Package throttle sets [Parse] when it is
// initialised; the rest is plain functions. Everything here is safe for
// concurrent use.
package keyspace

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ErrNotLimiterKey reports a Redis key that no Limiter or
// ConcurrencyLimiter writes: another prefix, a key of the worker or the
// scheduler, or one changed by hand.
var ErrNotLimiterKey = errors.New("throttle: not a limiter's key")

// Suffixes of the keys beside a limiter's state key, in its Cluster slot.
const (
	BlockSuffix   = ":block"   // the key's block (Limiter.BlockFor)
	SharesSuffix  = ":shares"  // the key's leased shares and their rest (WithLeasedShares)
	TicketsSuffix = ":tickets" // the generation of the key's tickets
	TicketInfix   = ":t:"      // then a ticket's escaped ID: its booking
	RoomSuffix    = ":room"    // the worker's waiting room of a meter key
	AsideSuffix   = ":aside"   // the room's waiters set aside, their flow held back
	WaitersSuffix = ":waiters" // the room's waiters: ID -> entry (see RoomWaiter)
	HeldSuffix    = ":held"    // the room's flows held back: flow -> until (Unix us)
)

// Registry returns the key of the hash where limiters under prefix record
// their names and policies in code (see package throttle's registry.go).
func Registry(prefix string) string { return prefix + "limiters" }

// Entry is a limiter's entry in the registry of names, stored as JSON.
type Entry struct {
	// Policy is the limiter's policy in code, in the short form
	// ParsePolicy reads ("gcra:10/1s:1", "conc:3/30s").
	Policy string `json:"policy"`
	// Live: the limiter applies stored policies (WithLivePolicies).
	Live bool `json:"live,omitempty"`
	// Leased: the limiter decides from leased shares (WithLeasedShares),
	// kept beside each key's state (SharesSuffix).
	Leased bool `json:"leased,omitempty"`
	// Rules are the worker's rules that use the limiter, by name.
	Rules []string `json:"rules,omitempty"`
}

// Value returns e as the registry stores it.
func (e Entry) Value() string {
	b, _ := json.Marshal(e) // strings and a bool: never fails
	return string(b)
}

// RegistryEntry reads a registry entry back (see Entry.Value); ok is false
// for a value not of that form.
func RegistryEntry(value string) (e Entry, ok bool) {
	if err := json.Unmarshal([]byte(value), &e); err != nil || e.Policy == "" {
		return Entry{}, false
	}
	return e, true
}

// HashedMark starts a caller key stored by its hash (WithKeyHashing). An
// escaped caller key never contains it ('%' is always escaped to "%25"), so
// a hashed key and a caller key given as is never meet.
const HashedMark = "%#"

// HashedLen is the length of a hashed caller key: the mark and the hex
// SHA-256 of the key.
const HashedLen = len(HashedMark) + 2*sha256.Size

// escaper makes a caller key safe inside a Redis Cluster hash tag. It is
// injective: '%' is escaped too, so two distinct caller keys never map to
// the same Redis key, and no '{' or '}' survives to move the tag.
var escaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

// Tag returns s as a Redis Cluster hash tag, "{" + s + "}", with '{', '}'
// and '%' escaped so that nothing in s can move the tag or make two
// strings share one.
func Tag(s string) string {
	return "{" + Escape(s) + "}"
}

// Escape returns s with '%', '{' and '}' escaped, without copying a string
// that has none.
func Escape(s string) string {
	if strings.ContainsAny(s, "%{}") {
		return escaper.Replace(s)
	}
	return s
}

// Unescape undoes Escape. It accepts only what the escaping produces, so
// that escaping the result gives back stored exactly: no bare brace, and no
// '%' but in "%25", "%7B" and "%7D".
func Unescape(stored string) (string, bool) {
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

// IsHashed reports a caller key stored by its hash: the mark and the
// SHA-256 in lowercase hex.
func IsHashed(stored string) bool {
	digits, ok := strings.CutPrefix(stored, HashedMark)
	if !ok || len(stored) != HashedLen {
		return false
	}
	for i := 0; i < len(digits); i++ {
		if c := digits[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// KeyKind says which of a limiter's keys a Redis key is.
type KeyKind int

const (
	// KeyState holds a caller key's state: what Peek and Allow read.
	KeyState KeyKind = iota
	// KeyBlock holds a caller key's block (Limiter.BlockFor), "…:block".
	KeyBlock
	// KeyTicket holds one ticket's booking, "…:t:<id>".
	KeyTicket
	// KeyTickets holds the generation of a caller key's tickets,
	// "…:tickets": Reset deletes it, and every ticket with it.
	KeyTickets
	// KeyShares holds a caller key's leased shares and their rest
	// (WithLeasedShares), "…:shares": the state of a limiter that leases.
	KeyShares
)

// String returns "state", "block", "ticket", "tickets" or "shares".
func (k KeyKind) String() string {
	switch k {
	case KeyShares:
		return "shares"
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

// KeyInfo is what Parse reads from a limiter's Redis key.
type KeyInfo struct {
	// Name is the limiter's name.
	Name string
	// Algorithm is the policy's algorithm in short: "gcra", "tb", "lb",
	// "fw", "sl", "sw", "quota" or "conc".
	Algorithm string
	// Caller is the caller key, with the key's escaping undone. For a
	// caller key stored by its hash, Caller is that stored form and Hashed
	// is true.
	Caller string
	// Hashed reports a caller key stored by its hash: the caller key itself
	// is not in Redis.
	Hashed bool
	// Kind says whether the key holds the state, the block or a ticket.
	Kind KeyKind
	// Ticket is a KeyTicket's ticket ID, its escaping undone; else "".
	Ticket string
}

// Concurrency reports whether the key belongs to a ConcurrencyLimiter.
func (k KeyInfo) Concurrency() bool { return k.Algorithm == "conc" }

// Parse takes apart a Redis key that a Limiter or ConcurrencyLimiter with
// the given prefix wrote: prefix + name@algorithm + ":{" +
// caller key + "}", then nothing (the state), ":block", ":tickets" or
// ":t:" + ticket. It accepts exactly the keys the library writes; any other
// key is an error wrapping [ErrNotLimiterKey]. Package throttle sets it
// when it is initialised.
var Parse func(prefix, key string) (KeyInfo, error)

// Inspecting is a throttle.Option (typed any here, which package throttle
// cannot import): the limiter is a tool's view of a limiter's keys
// (throttlectl, the dashboard), and records nothing in the registry of
// names. Package throttle sets it when it is initialised.
var Inspecting any

// ParseConcurrency reads the policy of a ConcurrencyLimiter without a name
// back from its short form, "conc:3/30s" (the limiter's name, and the
// policy in its keys): its limit and lease. Errors wrap
// throttle.ErrInvalidPolicy. Package throttle sets it when it is
// initialised.
var ParseConcurrency func(form string) (limit int, lease time.Duration, err error)

// RoomWaiter reads a waiting room's entry for one waiter (common_worker.lua's
// waiting_info: "eligible|tag|u<units>|<length>|<flow><payload>"): its
// fair-queueing tag, its units and its flow. ok is false for a waiter let
// out already (its entry starts with '=') or an entry not of that form.
func RoomWaiter(entry string) (tag int64, units int, flow string, ok bool) {
	if strings.HasPrefix(entry, "=") {
		return 0, 0, "", false
	}
	parts := strings.SplitN(entry, "|", 3)
	if len(parts) != 3 {
		return 0, 0, "", false
	}
	var err error
	if tag, err = strconv.ParseInt(parts[1], 10, 64); err != nil {
		return 0, 0, "", false
	}
	rest, units := parts[2], 1
	if u, after, found := strings.Cut(rest, "|"); found && strings.HasPrefix(u, "u") {
		if units, err = strconv.Atoi(u[1:]); err != nil || units < 1 {
			return 0, 0, "", false
		}
		rest = after
	}
	length, rest, found := strings.Cut(rest, "|")
	n, err := strconv.Atoi(length)
	if !found || err != nil || n < 0 || n > len(rest) {
		return 0, 0, "", false
	}
	return tag, units, rest[:n], true
}
