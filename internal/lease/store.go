// Package lease leases shares of a key's rate to processes, so that each
// decides within its share in memory, with no Redis call, while the
// shares and what Redis decides for everyone else never add up to more
// than the policy allows. lua/lease.lua keeps the shares and decides the
// rest; [Share] is a process's side of one key's lease.
//
// How the envelope holds. A grant is a rate and a burst, counted in Redis
// from the moment the script makes it to its lease's end (a lowered grant's
// predecessor until the old end). A [Share] starts with the tokens the
// rest handed over with the grant (taken from the rest, never more than the
// grant's burst), refills at its grant's rate up to its burst, and stops
// deciding at the moment its
// request was sent plus the lease, before Redis stops counting it. So at
// every instant the shares in use are at most the grants counted, and
// these with the rest at most the policy's rate and burst.
package lease

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/jobthrottle/jobthrottle/internal/scripts"
	"github.com/jobthrottle/jobthrottle/lua"
	"github.com/redis/go-redis/v9"
)

// Keys are a key's two Redis keys, in one Cluster slot: its lease state
// and its block (see Limiter.BlockFor).
type Keys struct {
	State, Block string
}

func (k Keys) list() []string { return []string{k.State, k.Block} }

// KeysOf returns the Redis keys of the shares of the limiter key stateKey
// (what Limiter.Key returns for a caller key).
func KeysOf(stateKey string) Keys {
	return Keys{State: stateKey + keyspace.SharesSuffix, Block: stateKey + keyspace.BlockSuffix}
}

// PolicyOf reads a policy in its short form ("gcra:10/1s:5") as the lease
// script takes it; false for a policy that leases nothing (not a
// TokenBucket or GCRA). Package throttle sets it.
var PolicyOf func(policy string) (Policy, bool)

// ReadKey reads the shares of the limiter key stateKey under policy, in
// its short form, for the operator's tools; false, and nothing read, when
// the policy leases nothing.
func ReadKey(ctx context.Context, client redis.Scripter, stateKey, policy string) (State, bool, error) {
	p, ok := PolicyOf(policy)
	if !ok {
		return State{}, false, nil
	}
	st, err := NewStore(client).Read(ctx, KeysOf(stateKey), p)
	return st, err == nil, err
}

// Policy is the rate and burst a key's grants and rest share.
type Policy struct {
	Rate  float64 // units per second, > 0
	Burst int     // units, >= 1
}

func (p Policy) args() (string, string) {
	return strconv.FormatFloat(p.Rate, 'f', -1, 64), strconv.Itoa(p.Burst)
}

// Grant is what Redis granted a holder: a rate and a burst for a lease.
// A zero Rate means nothing was granted.
type Grant struct {
	Rate  float64       // units per second
	Burst float64       // units
	Lease time.Duration // from the moment Redis made it
	At    time.Time     // Redis's clock when it made it
	// Full reports a grant of all the demand asked: a request the share
	// refuses is a clump of arrivals, which the rest may take, not a demand
	// beyond the holder's part.
	Full bool
	// Again, when the others' grants held this one below the holder's
	// part, is how soon one of them stops counting: the holder's next
	// request should come then rather than at its usual renewal. 0: none.
	Again time.Duration
	// Tokens are the rest's saved tokens handed over with the grant: the
	// holder's bucket starts with them (see Share.Apply).
	Tokens float64
	// Small reports a holder that wants too little for a share while the
	// key is wanted beyond its rate: its demand is not kept as its own, and
	// its requests of the rest count as the rest's demand (TakeRest's
	// holder false).
	Small bool
}

// Decision is the rest's answer to a request of units.
type Decision struct {
	Allowed    bool
	Remaining  int
	RetryAfter time.Duration
	At         time.Time // Redis's clock when it decided
}

// Holder is one holder's grant as Redis counts it.
type Holder struct {
	ID                        string
	Rate, Burst               float64 // granted
	Ends                      time.Time
	CountedRate, CountedBurst float64 // counted now (a lowered grant's predecessor included)
	Demand                    float64 // units per second, as it last said
}

// State is a key's leases as Redis holds them at a moment.
type State struct {
	At                  time.Time
	RestRate, RestBurst float64 // what the grants leave
	RestTokens          float64
	RestDemand          float64 // units per second asked of the rest, last measured
	Holders             []Holder
}

// Modes of lua/lease.lua.
const (
	modeTakeRest = 0
	modeGrant    = 1
	modeRelease  = 2
	modeRead     = 3
)

var script = scripts.Load(lua.Scripts, "assembled/lease.lua")

// ErrBadReply is a reply of lua/lease.lua this package cannot read.
var ErrBadReply = errors.New("throttle: unexpected reply from the lease script")

// Store runs lua/lease.lua on a client. It is safe for concurrent use.
type Store struct {
	client redis.Scripter
}

// NewStore returns a Store on client.
func NewStore(client redis.Scripter) *Store { return &Store{client: client} }

// Ask is a holder's request for a share.
type Ask struct {
	Demand float64       // units per second it wants
	Lease  time.Duration // how long the share is to last
	// Least is the least burst worth a share: a share gets at least this
	// burst when the others leave it, and none is granted otherwise.
	Least float64
	// Unasked is the units the holder asked of the rest without asking
	// for a share (before its first request, or while it wanted too
	// little for one) since its last request: unless it still wants too
	// little, they are its own demand, not that of the processes that ask
	// for none.
	Unasked float64
}

// Grant asks for holder's share of the key's rate. Nothing granted is a Grant
// whose Rate is 0; the holder's demand is kept for the lease all the same,
// so that the others' renewals leave it room.
func (s *Store) Grant(ctx context.Context, k Keys, holder string, p Policy, a Ask) (Grant, error) {
	rate, burst := p.args()
	v, err := script.Run(ctx, s.client, k.list(), modeGrant, rate, burst, holder,
		strconv.FormatFloat(a.Demand, 'f', -1, 64), a.Lease.Microseconds(), strconv.FormatFloat(a.Least, 'f', -1, 64),
		strconv.FormatFloat(a.Unasked, 'f', -1, 64)).Slice()
	if err != nil {
		return Grant{}, err
	}
	if len(v) != 7 {
		return Grant{}, fmt.Errorf("%w: %v", ErrBadReply, v)
	}
	g := Grant{Rate: decimal(v[0]), Burst: decimal(v[1])}
	g.Full = g.Rate > 0 && g.Rate >= a.Demand*(1-1e-9)
	us, _ := v[2].(int64)
	now, _ := v[3].(int64)
	again, _ := v[4].(int64)
	g.Lease, g.At = time.Duration(us)*time.Microsecond, time.UnixMicro(now)
	g.Again = time.Duration(again) * time.Microsecond
	g.Tokens = decimal(v[5])
	registered, _ := v[6].(int64)
	g.Small = registered == 0
	return g, nil
}

// Release gives holder's share of the key back at once. The holder must have
// stopped deciding under it.
func (s *Store) Release(ctx context.Context, k Keys, holder string, p Policy) error {
	rate, burst := p.args()
	return script.Run(ctx, s.client, k.list(), modeRelease, rate, burst, holder).Err()
}

// TakeRest asks the rest (what the grants leave) for n units. holder
// says the caller holds or asked for a share: its demand is its own, not
// the rest's.
func (s *Store) TakeRest(ctx context.Context, k Keys, p Policy, n int, holder bool) (Decision, error) {
	rate, burst := p.args()
	h := "0"
	if holder {
		h = "1"
	}
	v, err := script.Run(ctx, s.client, k.list(), modeTakeRest, rate, burst, n, h).Int64Slice()
	if err != nil {
		return Decision{}, err
	}
	if len(v) != 4 {
		return Decision{}, fmt.Errorf("%w: %v", ErrBadReply, v)
	}
	return Decision{Allowed: v[0] == 1, Remaining: int(v[1]), RetryAfter: time.Duration(v[2]) * time.Microsecond, At: time.UnixMicro(v[3])}, nil
}

// Read returns the key's leases as Redis holds them now; it writes
// nothing.
func (s *Store) Read(ctx context.Context, k Keys, p Policy) (State, error) {
	rate, burst := p.args()
	v, err := script.Run(ctx, s.client, k.list(), modeRead, rate, burst).Slice()
	if err != nil {
		return State{}, err
	}
	if len(v) < 5 || (len(v)-5)%7 != 0 {
		return State{}, fmt.Errorf("%w: %v", ErrBadReply, v)
	}
	now, _ := v[0].(int64)
	st := State{At: time.UnixMicro(now), RestRate: decimal(v[1]), RestBurst: decimal(v[2]), RestTokens: decimal(v[3]), RestDemand: decimal(v[4])}
	for i := 5; i < len(v); i += 7 {
		id, _ := v[i].(string)
		ends, _ := v[i+3].(int64)
		st.Holders = append(st.Holders, Holder{
			ID: id, Rate: decimal(v[i+1]), Burst: decimal(v[i+2]), Ends: time.UnixMicro(ends),
			CountedRate: decimal(v[i+4]), CountedBurst: decimal(v[i+5]), Demand: decimal(v[i+6]),
		})
	}
	return st, nil
}

// decimal reads a decimal string of the script's reply (0 if it is not).
func decimal(v any) float64 {
	s, _ := v.(string)
	f, _ := strconv.ParseFloat(s, 64)
	return f
}
