package throttle

import (
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// noPolicy reports a nil policy, or a nil pointer to one ((*GCRA)(nil)
// satisfies Policy too, and would panic when used).
func noPolicy(p Policy) bool {
	if p == nil {
		return true
	}
	v := reflect.ValueOf(p)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// Policy is a rate-limiting algorithm with its parameters: one of
// [FixedWindow], [SlidingLog], [SlidingWindow], [TokenBucket], [LeakyBucket]
// or [GCRA]. Policies are plain values, safe to copy and share. The set is
// closed: the unexported method ties each policy to its Lua script.
type Policy interface {
	// Validate reports why the policy cannot be used, as an error wrapping
	// ErrInvalidPolicy, or nil.
	Validate() error

	// String returns the policy's short form, which ParsePolicy reads:
	// "gcra:10/1s:5".
	String() string

	// spec describes how the policy runs; call it on a validated policy.
	spec() spec
}

// Compile-time checks that every algorithm satisfies Policy.
var (
	_ Policy = FixedWindow{}
	_ Policy = SlidingLog{}
	_ Policy = SlidingWindow{}
	_ Policy = TokenBucket{}
	_ Policy = LeakyBucket{}
	_ Policy = GCRA{}
)

// spec is everything a Limiter needs to run a policy.
type spec struct {
	// policy is the policy the spec runs.
	policy Policy
	// kind names the algorithm, as in the policy's short form: "gcra".
	kind string
	// form is the policy's String, for observers.
	form string
	// source says where the policy in force came from, for observers:
	// SourceCode, SourcePlan, SourceStored or SourceStoredForKey.
	source PolicySource
	// id names the algorithm and its parameters inside every Redis key, so
	// that two policies never share state, e.g. "gcra:10/1s:5".
	id string
	// script is the algorithm's Lua, run with EVALSHA and EVAL as fallback.
	script *redis.Script
	// capacity is the most units one request may ask for, and Result.Limit.
	capacity int
	// args are the script's arguments after mode and n, boxed once.
	args []any
	// den is the meters' tick: 1/den of a microsecond; 0 for windows.
	// num is a meter's unit in ticks (its emission interval).
	den, num int64
	// calendar, for a Quota, returns the bounds of the periods around an
	// instant, script arguments that follow the undo arguments.
	calendar func(at time.Time) []any
	// reservable reports whether the policy books future slots (Reserve);
	// its reservations, cancellations and blocks then run meterBookingScript.
	reservable bool
}

// Script modes (ARGV[1]), as common.lua defines them; modeArgs holds
// their arguments, boxed once.
const (
	modeTake = iota
	modePeek
	modeReserve
	modeCancel
	modeBlock
)

var modeArgs = [...]any{modeTake: "0", modePeek: "1", modeReserve: "2", modeCancel: "3", modeBlock: "4"}

// boxArgs boxes a policy's script arguments once.
func boxArgs(params ...string) []any {
	args := make([]any, len(params))
	for i, p := range params {
		args[i] = p
	}
	return args
}

// compiled returns the spec of a validated policy.
func compiled(p Policy) *spec {
	sp := p.spec()
	sp.policy, sp.form, sp.source = p, p.String(), SourceCode
	return &sp
}

// shortDuration writes d as time.Duration does, without the zero minutes
// and seconds it ends whole hours and minutes with: "1m", "1h", "1h30m".
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// String returns the policy's short form, which ParsePolicy reads back:
// "gcra:10/1s:5".
func (p GCRA) String() string {
	return fmt.Sprintf("gcra:%d/%s:%d", p.Rate.N, shortDuration(p.Rate.Per), p.Burst)
}

// String returns the policy's short form, which ParsePolicy reads back:
// "tb:10/1s:5".
func (p TokenBucket) String() string {
	return fmt.Sprintf("tb:%d/%s:%d", p.Rate.N, shortDuration(p.Rate.Per), p.Burst)
}

// String returns the policy's short form, which ParsePolicy reads back:
// "lb:10/1s:5".
func (p LeakyBucket) String() string {
	return fmt.Sprintf("lb:%d/%s:%d", p.Rate.N, shortDuration(p.Rate.Per), p.Capacity)
}

// String returns the policy's short form, which ParsePolicy reads back:
// "fw:25/1m".
func (p FixedWindow) String() string {
	return fmt.Sprintf("fw:%d/%s", p.Limit, shortDuration(p.Window))
}

// String returns the policy's short form, which ParsePolicy reads back:
// "sl:25/1s".
func (p SlidingLog) String() string { return fmt.Sprintf("sl:%d/%s", p.Limit, shortDuration(p.Window)) }

// String returns the policy's short form, which ParsePolicy reads back:
// "sw:25/1s".
func (p SlidingWindow) String() string {
	return fmt.Sprintf("sw:%d/%s", p.Limit, shortDuration(p.Window))
}
