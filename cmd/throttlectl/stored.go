package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"

	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// This file holds set, get and unset, which store the policies of named
// limiters, and how peek, reset and top find a named limiter's policy.

// runSet stores a named limiter's policy, or one caller key's; with
// --replace, the limiter's policy whatever the name's algorithm was.
func runSet(a *app, args []string) error {
	var replace, fresh *bool
	flags := func(fs *flag.FlagSet) {
		replace = fs.Bool("replace", false, "move the name to POLICY's algorithm: remove every policy stored for it and store POLICY (limiters of the old algorithm still running keep the policy they have)")
		fresh = fs.Bool("new", false, "store the policy for a name no limiter has used under the prefix yet (limiters about to start)")
	}
	a.newName = func() bool { return *fresh }
	return a.changeStored(args, 2, "NAME POLICY", flags, func(ctx context.Context, s *throttle.PolicyStore, operands []string, key []string) error {
		p, err := parseRatePolicy(operands[1])
		if err != nil {
			return usagef("set: %v", err)
		}
		if *replace {
			if len(key) > 0 {
				return usagef("set: --replace changes the policy of the whole limiter, not of one --key")
			}
			err = s.Replace(ctx, operands[0], p)
		} else {
			err = s.Set(ctx, operands[0], p, key...)
		}
		if err != nil {
			return storeError("set", err)
		}
		return nil
	})
}

// runUnset removes a named limiter's stored policy, or one caller key's.
func runUnset(a *app, args []string) error {
	return a.changeStored(args, 1, "NAME", nil, func(ctx context.Context, s *throttle.PolicyStore, operands []string, key []string) error {
		if err := s.Unset(ctx, operands[0], key...); err != nil {
			return storeError("unset", err)
		}
		return nil
	})
}

// runGet shows what is stored for a named limiter.
func runGet(a *app, args []string) error {
	fs := a.commandFlags()
	operands, err := a.parseCommand(fs, args)
	if err != nil {
		return err
	}
	name, err := a.oneOperand(operands, "NAME")
	if err != nil {
		return err
	}
	return a.withStore(func(ctx context.Context, client redis.UniversalClient, s *throttle.PolicyStore) error {
		if err := a.checkName(ctx, client, s, name); err != nil {
			return err
		}
		return a.showStored(ctx, s, name)
	})
}

// checkName refuses a name no limiter has used under the prefix (none in
// the registry of names, nothing ever stored or read for it): a mistyped
// name or --prefix would otherwise store a policy nothing reads. set --new
// lets it through. For set, it notes on stderr when the name's limiters do
// not apply stored policies.
func (a *app) checkName(ctx context.Context, client redis.UniversalClient, s *throttle.PolicyStore, name string) error {
	value, err := client.HGet(ctx, keyspace.Registry(a.prefix), name).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	entry, registered := keyspace.RegistryEntry(value)
	st, err := s.Get(ctx, name)
	if err != nil {
		return storeError(a.command.name, err)
	}
	fresh := a.newName != nil && a.newName()
	if !registered && st.Version == 0 && st.Kind == "" && !fresh {
		hint := "check the name and --prefix"
		if a.command.name == "set" {
			hint += ", or give --new to store a policy for limiters not started yet"
		}
		return usagef("%s: no limiter called %q has decided under the prefix %q: %s", a.command.name, name, a.prefix, hint)
	}
	if registered && !entry.Live && a.command.name == "set" {
		fmt.Fprintf(a.stderr, "throttlectl: note: the limiters called %q were created without throttle.WithLivePolicies: they do not apply stored policies\n", name)
	}
	return nil
}

// changeStored parses set's and unset's command line (want operands,
// --key and the flags more adds, when not nil), runs change and shows what
// is stored after it.
func (a *app) changeStored(args []string, want int, what string, more func(*flag.FlagSet), change func(context.Context, *throttle.PolicyStore, []string, []string) error) error {
	fs := a.commandFlags()
	key := fs.String("key", "", "the caller `key` whose policy to change, rather than the limiter's")
	if more != nil {
		more(fs)
	}
	operands, err := a.parseCommand(fs, args)
	if err != nil {
		return err
	}
	if len(operands) != want {
		return usagef("%s: want %s, got %q", a.command.name, what, operands)
	}
	var keys []string
	if *key != "" {
		keys = []string{*key}
	}
	return a.withStore(func(ctx context.Context, client redis.UniversalClient, s *throttle.PolicyStore) error {
		if err := a.checkName(ctx, client, s, operands[0]); err != nil {
			return err
		}
		if err := change(ctx, s, operands, keys); err != nil {
			return err
		}
		return a.showStored(ctx, s, operands[0])
	})
}

// withStore connects and runs do on the policy store under the prefix,
// within the --timeout.
func (a *app) withStore(do func(context.Context, redis.UniversalClient, *throttle.PolicyStore) error) error {
	client, err := a.connect(context.Background())
	if err != nil {
		return err
	}
	defer client.Close()
	s, err := throttle.NewPolicyStore(client, a.prefix)
	if err != nil {
		return usageError{err}
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
	defer cancel()
	return do(ctx, client, s)
}

// storeError marks the store's refusals of bad input as usage errors.
func storeError(command string, err error) error {
	if isUsage(err) {
		return usagef("%s: %v", command, err)
	}
	return fmt.Errorf("%s: %w", command, err)
}

// isUsage reports an error of the input rather than of Redis.
func isUsage(err error) bool {
	for _, e := range []error{throttle.ErrInvalidPolicy, throttle.ErrInvalidKey, throttle.ErrInvalidOption} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// jsonStored is what is stored for a named limiter, in --json output.
type jsonStored struct {
	Limiter   string            `json:"limiter"`
	Algorithm string            `json:"algorithm,omitempty"`
	Policy    string            `json:"policy,omitempty"`
	Keys      map[string]string `json:"keys"`
	Invalid   map[string]string `json:"invalid,omitempty"`
	Version   int64             `json:"version"`
}

// showStored writes what is stored for name.
func (a *app) showStored(ctx context.Context, s *throttle.PolicyStore, name string) error {
	st, err := s.Get(ctx, name)
	if err != nil {
		return storeError("get", err)
	}
	j := jsonStored{Limiter: st.Name, Algorithm: st.Kind, Keys: map[string]string{}, Invalid: st.Invalid, Version: st.Version}
	if st.Policy != nil {
		j.Policy = st.Policy.String()
	}
	for k, p := range st.Keys {
		j.Keys[k] = p.String()
	}
	if a.json {
		return a.writeJSON(j)
	}
	tw := newTable(a.stdout)
	row(tw, "LIMITER", "KEY", "POLICY")
	all := j.Policy
	if all == "" {
		all = "- (the policy in code)"
	}
	row(tw, display(name), "*", all)
	keys := make([]string, 0, len(j.Keys))
	for k := range j.Keys {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		row(tw, display(name), display(k), j.Keys[k])
	}
	for field, why := range st.Invalid {
		row(tw, display(name), display(field), "unreadable, ignored: "+oneLine(why))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err = fmt.Fprintf(a.stdout, "version %s; processes apply a change within a second\n", strconv.FormatInt(j.Version, 10))
	return err
}

// storedPolicy returns the policy stored for name that applies to caller:
// its own, else the limiter's; nil when none is stored.
func storedPolicy(ctx context.Context, client redis.UniversalClient, prefix, name, caller string) (throttle.Policy, error) {
	s, err := throttle.NewPolicyStore(client, prefix)
	if err != nil {
		return nil, usageError{err}
	}
	st, err := s.Get(ctx, name)
	if err != nil {
		return nil, err
	}
	if p, ok := st.Keys[caller]; ok {
		return p, nil
	}
	return st.Policy, nil
}
