package throttle

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jobthrottle/jobthrottle/internal/bounded"
	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/jobthrottle/jobthrottle/internal/redisclient"
	"github.com/redis/go-redis/v9"
)

// Stored policies. An operator changes a named limiter's policy while the
// fleet runs by storing it in Redis: one hash per limiter name,
// prefix + "policy:{" + name + "}", whose fields are
//
//	"*"         the limiter's policy, for every caller key
//	"k:" + key  the policy of one caller key (an override)
//	"v"         a version, raised by every change
//	"kind"      the algorithm of the limiters that read it, such as "gcra"
//
// Policies are stored in the short form ParsePolicy reads. Every Limiter
// created with WithLivePolicies reads its hash when it starts and again at most
// liveStale later, in the background while decisions flow (see live.go):
// no decision waits for it unless the limiter was idle. A stored policy
// overrides the one in code; the one in code applies when nothing is
// stored.

// Field names of a stored policy hash.
const (
	storedAll     = "*"
	storedKey     = "k:"
	storedVersion = "v"
	storedKind    = "kind"
)

// PolicyStore sets, reads and removes the policies stored for named
// limiters (see [WithLivePolicies]): what throttlectl's set, get and unset do. It
// is safe for concurrent use; the zero value is not usable: call
// [NewPolicyStore].
type PolicyStore struct {
	client redis.UniversalClient
	prefix string
}

// NewPolicyStore returns a store of the limiters' policies kept under
// prefix in client ([DefaultPrefix] when prefix is "": the prefix the
// limiters were given with [WithPrefix]). Errors wrap [ErrInvalidOption].
func NewPolicyStore(client redis.UniversalClient, prefix string) (*PolicyStore, error) {
	if redisclient.IsNil(client) {
		return nil, fmt.Errorf("%w: nil redis client", ErrInvalidOption)
	}
	redisclient.FollowFailovers(client)
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if err := keyspace.CheckPrefix(prefix); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	return &PolicyStore{client: client, prefix: prefix}, nil
}

// StoredPolicies is what is stored for one limiter name.
type StoredPolicies struct {
	// Name is the limiter's name.
	Name string
	// Policy is the stored policy for every caller key, nil when none.
	Policy Policy
	// Keys holds the stored policies of single caller keys.
	Keys map[string]Policy
	// Kind is the algorithm of the limiters of this name that read the
	// store ("gcra", "tb", "lb", "fw", "sl", "sw"), "" before any did.
	Kind string
	// Version is raised by every change; 0 when nothing was ever stored.
	Version int64
	// Invalid lists fields holding a policy that cannot be read (written
	// by something other than Set), with the reason: limiters ignore them.
	Invalid map[string]string
}

// Set stores p as the policy of the limiters named name, for every caller
// key, or for callerKey alone when it is given. Every process applies it
// within a second. p must be valid and of the same algorithm as the
// limiters of that name (errors wrap [ErrInvalidPolicy]: to move the name
// to another algorithm, see Replace); name and callerKey must not be empty
// ([ErrInvalidKey]). Like every call of the library, it returns when ctx
// ends, whatever the client's options.
func (s *PolicyStore) Set(ctx context.Context, name string, p Policy, callerKey ...string) error {
	field, err := storedField(name, callerKey)
	if err != nil {
		return err
	}
	sp, err := storable(p)
	if err != nil {
		return err
	}
	// WATCHed: a Replace between the check and the write is not
	// overwritten by a policy of the old algorithm
	key := storedPolicyKey(s.prefix, name)
	return s.watched(ctx, key, func(ctx context.Context, tx *redis.Tx) error {
		kind, err := tx.HGet(ctx, key, storedKind).Result()
		if err != nil && err != redis.Nil {
			return err
		}
		if err := ofKind(sp, kind); err != nil {
			return err
		}
		_, err = tx.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
			pipe.HSet(ctx, key, field, sp.id)
			pipe.HSetNX(ctx, key, storedKind, sp.kind)
			pipe.HIncrBy(ctx, key, storedVersion, 1)
			return nil
		})
		return err
	})
}

// Replace makes p the policy of the limiters named name, for every caller
// key, and p's algorithm the name's, even when the name was of another:
// what to do when the fleet moves a named limiter to another algorithm, or
// after a first Set of the wrong one (the first Set, or the first limiter
// of the name to run, records the algorithm). Every policy stored for the
// name is removed first, those of single caller keys too. Limiters of p's
// algorithm apply p within a second; limiters of the old algorithm that
// still run keep the policy they had in force for every key (the stored
// one, else theirs in code) and log once that the stored policy is of
// another algorithm. No state is touched: a named limiter's state is kept
// per algorithm, so limiters of p's algorithm start afresh. Errors as for
// Set.
func (s *PolicyStore) Replace(ctx context.Context, name string, p Policy) error {
	if err := validName(name); err != nil {
		return err
	}
	sp, err := storable(p)
	if err != nil {
		return err
	}
	key := storedPolicyKey(s.prefix, name)
	return s.watched(ctx, key, func(ctx context.Context, tx *redis.Tx) error {
		fields, err := tx.HKeys(ctx, key).Result()
		if err != nil {
			return err
		}
		_, err = tx.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
			for _, field := range fields {
				if _, ok := storedCaller(field); ok && field != storedAll {
					pipe.HDel(ctx, key, field)
				}
			}
			pipe.HSet(ctx, key, storedAll, sp.id, storedKind, sp.kind)
			pipe.HIncrBy(ctx, key, storedVersion, 1)
			return nil
		})
		return err
	})
}

// Unset removes the policy stored for the limiters named name (or for
// callerKey alone): the policy in code applies again, within a second.
// Removing what is not stored is not an error. The name's algorithm stays
// recorded (see Replace to change it).
func (s *PolicyStore) Unset(ctx context.Context, name string, callerKey ...string) error {
	field, err := storedField(name, callerKey)
	if err != nil {
		return err
	}
	key := storedPolicyKey(s.prefix, name)
	return s.call(ctx, func(ctx context.Context) error {
		pipe := s.client.TxPipeline()
		pipe.HDel(ctx, key, field)
		pipe.HIncrBy(ctx, key, storedVersion, 1)
		_, err := pipe.Exec(ctx)
		return err
	})
}

// Get returns what is stored for the limiters named name.
func (s *PolicyStore) Get(ctx context.Context, name string) (StoredPolicies, error) {
	if _, err := storedField(name, nil); err != nil {
		return StoredPolicies{}, err
	}
	var fields map[string]string
	err := s.call(ctx, func(ctx context.Context) error {
		var err error
		fields, err = s.client.HGetAll(ctx, storedPolicyKey(s.prefix, name)).Result()
		return err
	})
	if err != nil {
		return StoredPolicies{}, err
	}
	return readStored(name, fields), nil
}

// call runs fn, the store's exchange with Redis, bounded by ctx whatever
// the client's options; a WATCHed key changed under it is tried again, a
// few times. Errors of Redis wrap [ErrUnavailable] or [ErrRefused]; a
// refusal of the input is returned as it is.
func (s *PolicyStore) call(ctx context.Context, fn func(context.Context) error) error {
	err := bounded.Call(ctx, func(ctx context.Context) error {
		var err error
		for range 5 {
			if err = fn(ctx); err != redis.TxFailedErr {
				return err
			}
		}
		return err
	})
	if err == nil || errors.Is(err, ErrInvalidPolicy) {
		return err
	}
	if redisclient.MovedOnPlainClient(s.client, err) {
		return fmt.Errorf("%w: %w (the server is a node of a Redis Cluster: give the store a *redis.ClusterClient, redis.NewClusterClient)", ErrRefused, err)
	}
	return redisFailure(ctx, err)
}

// watched runs fn with key WATCHed, through call: a transaction fn ends
// with fails when key changed meanwhile, and fn runs again.
func (s *PolicyStore) watched(ctx context.Context, key string, fn func(context.Context, *redis.Tx) error) error {
	return s.call(ctx, func(ctx context.Context) error {
		return s.client.Watch(ctx, func(tx *redis.Tx) error { return fn(ctx, tx) }, key)
	})
}

// storable checks a policy to be stored and returns its spec.
func storable(p Policy) (spec, error) {
	if noPolicy(p) {
		return spec{}, fmt.Errorf("%w: nil policy", ErrInvalidPolicy)
	}
	if err := p.Validate(); err != nil {
		return spec{}, err
	}
	return p.spec(), nil
}

// readStored reads a stored policy hash.
func readStored(name string, fields map[string]string) StoredPolicies {
	st := StoredPolicies{Name: name, Keys: map[string]Policy{}, Kind: fields[storedKind]}
	fmt.Sscan(fields[storedVersion], &st.Version)
	for field, text := range fields {
		caller, ok := storedCaller(field)
		if !ok {
			continue
		}
		p, err := ParsePolicy(text)
		if err == nil {
			err = ofKind(p.spec(), st.Kind)
		}
		if err != nil {
			if st.Invalid == nil {
				st.Invalid = map[string]string{}
			}
			st.Invalid[field] = err.Error()
			continue
		}
		if field == storedAll {
			st.Policy = p
		} else {
			st.Keys[caller] = p
		}
	}
	return st
}

// storedCaller reads a field of a stored policy hash: a policy for every
// caller key (caller ""), or for one; ok is false for other fields.
func storedCaller(field string) (caller string, ok bool) {
	if field == storedAll {
		return "", true
	}
	return strings.CutPrefix(field, storedKey)
}

// storedField returns the hash field of a stored policy.
func storedField(name string, callerKey []string) (string, error) {
	if err := validName(name); err != nil {
		return "", err
	}
	switch len(callerKey) {
	case 0:
		return storedAll, nil
	case 1:
		if callerKey[0] == "" {
			return "", fmt.Errorf("%w: empty caller key", ErrInvalidKey)
		}
		return storedKey + callerKey[0], nil
	}
	return "", fmt.Errorf("%w: one caller key at most, got %d", ErrInvalidKey, len(callerKey))
}

// storedPolicyKey returns the key of the hash of the policies stored for
// the limiters named name.
func storedPolicyKey(prefix, name string) string {
	return prefix + "policy:" + keyspace.Tag(name)
}

// validName checks a limiter's name: it goes into Redis keys.
func validName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty name", ErrInvalidKey)
	}
	if strings.ContainsAny(name, "{}@") {
		return fmt.Errorf("%w: name %q must not contain '{', '}' or '@'", ErrInvalidKey, name)
	}
	return nil
}

// ofKind checks that a policy of spec sp may be stored for limiters of
// the algorithm kind ("" when none has said which yet).
func ofKind(sp spec, kind string) error {
	if kind == "" || sp.kind == kind {
		return nil
	}
	return invalidPolicy("%s is %s, and the limiters of this name are %s, which keep their state differently; to move the name to %s, replace its policy (PolicyStore.Replace, throttlectl set --replace)",
		sp.id, kindName(sp.kind), kindName(kind), kindName(sp.kind))
}

// kindName names an algorithm by its short form.
func kindName(kind string) string {
	switch kind {
	case "gcra":
		return "GCRA"
	case "tb":
		return "TokenBucket"
	case "lb":
		return "LeakyBucket"
	case "fw":
		return "FixedWindow"
	case "sl":
		return "SlidingLog"
	case "sw":
		return "SlidingWindow"
	case "quota":
		return "Quota"
	case "conc":
		return "Concurrency"
	}
	return kind
}
