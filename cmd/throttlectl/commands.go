package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/redis/go-redis/v9"
)

// runPeek shows one key's state.
func runPeek(a *app, args []string) error {
	return a.withState(args, func(context.Context, target, *limiter, state) error { return nil }, a.writePeek)
}

// runReset forgets one key's state, and shows what it was.
func runReset(a *app, args []string) error {
	reset := func(ctx context.Context, t target, l *limiter, _ state) error { return l.reset(ctx, t.caller) }
	return a.withState(args, reset, a.writeReset)
}

// withState opens the key peek and reset name, reads its state, runs do on
// it and writes the state it read. A key with no state in Redis is full:
// its state is written as such (do is not run: there is nothing to
// reset), with a note on stderr naming the limiters that do hold state for
// the caller key, in case the name or key was mistyped.
func (a *app) withState(args []string, do func(context.Context, target, *limiter, state) error, write func(state) error) error {
	t, l, client, err := a.open(args)
	if err != nil {
		return err
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
	defer cancel()
	s, err := l.peek(ctx, t.caller)
	if err != nil {
		return err
	}
	present, err := l.present(ctx, s)
	if err != nil {
		return err
	}
	if !present {
		s.absent = true
		fmt.Fprintf(a.stderr, "throttlectl: note: %v\n", a.errNoState(client, l, t.caller))
		return write(s)
	}
	if err := do(ctx, t, l, s); err != nil {
		return err
	}
	return write(s)
}

// open parses peek's and reset's command line and connects: it returns the
// key, its limiter and the client, which the caller closes.
func (a *app) open(args []string) (target, *limiter, redis.UniversalClient, error) {
	fs := a.commandFlags()
	var pf policyFlags
	pf.register(fs)
	operands, err := a.parseCommand(fs, args)
	if err != nil {
		return target{}, nil, nil, err
	}
	operand, err := a.oneOperand(operands, "KEY")
	if err != nil {
		return target{}, nil, nil, err
	}
	t, err := a.resolveTarget(pf, operand)
	if err != nil {
		return target{}, nil, nil, err
	}
	client, err := a.connect(context.Background())
	if err != nil {
		return target{}, nil, nil, err
	}
	if !t.policy.known() {
		ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
		t.policy, err = a.lookUpPolicy(ctx, client, t.policy.name, t.caller, nil)
		cancel()
		if err == nil && !t.policy.known() {
			err = usagef("%s: no limiter called %q has decided under the prefix %q (none is in its registry of names, no policy is stored for it): check the name and --prefix, or give the policy with --policy", a.command.name, t.policy.name, a.prefix)
		}
		if err != nil {
			_ = client.Close()
			return target{}, nil, nil, err
		}
	}
	l, err := newLimiter(client, a.prefix, t.policy)
	if err != nil {
		_ = client.Close()
		return target{}, nil, nil, err
	}
	return t, l, client, nil
}

// topOptions are top's own flags.
type topOptions struct {
	all    bool
	limit  int
	config string
}

// runTop lists the throttled keys under the prefix, longest wait first.
func runTop(a *app, args []string) error {
	fs := a.commandFlags()
	var opts topOptions
	fs.BoolVar(&opts.all, "all", false, "list every key, throttled or not")
	fs.IntVar(&opts.limit, "limit", 0, "list at most `N` keys, the longest waits; 0: no limit")
	fs.StringVar(&opts.config, "config", "", "JSON `file` mapping named limiters to their policies in code, for those with none stored")
	operands, err := a.parseCommand(fs, args)
	if err != nil {
		return err
	}
	if len(operands) > 0 {
		return usagef("top: takes no arguments, got %q", operands)
	}
	if opts.limit < 0 {
		return usagef("--limit must not be negative, got %d", opts.limit)
	}
	client, err := a.connect(context.Background())
	if err != nil {
		return err
	}
	defer client.Close()
	keys, err := a.scanPrefix(context.Background(), client)
	if err != nil {
		return err
	}
	var inCode map[string]string
	if opts.config != "" {
		if inCode, err = readConfig(opts.config); err != nil {
			return err
		}
	}
	scanned, err := a.limitersOf(client, keys, inCode)
	if err != nil {
		return err
	}
	states, err := a.peekAll(scanned)
	if err != nil {
		return err
	}
	shown := states[:0]
	for _, s := range states {
		if opts.all || s.throttled() {
			shown = append(shown, s)
		}
	}
	sortByWait(shown)
	if opts.limit > 0 && len(shown) > opts.limit {
		shown = shown[:opts.limit]
	}
	return a.writeTop(shown, scanned)
}

// found is what a scan found: each limiter key once, and what it passed.
type found struct {
	keys     []foundKey
	limiters map[string]*limiter // by policy id, or name@algorithm
	scanned  int                 // keys under the prefix
	hashed   int                 // keys whose caller key is stored by hash
	unknown  int                 // keys of named limiters whose policy is not known
}

type foundKey struct {
	policy, caller string
}

// limitersOf reads scanned keys back to limiter and caller key. Blocks and
// tickets fold into their caller key's entry; keys no limiter writes (the
// worker's and the scheduler's) are passed over, and so are caller keys
// stored by hash, which cannot be peeked.
func (a *app) limitersOf(client redis.UniversalClient, keys []string, inCode map[string]string) (found, error) {
	f := found{limiters: map[string]*limiter{}, scanned: len(keys)}
	seen := map[foundKey]bool{}
	for _, key := range keys {
		info, err := parseKey(a.prefix, key)
		if notLimiterKey(err) {
			continue
		}
		if err != nil {
			return found{}, err
		}
		id := limiterID(info)
		k := foundKey{id, info.Caller}
		if seen[k] {
			continue
		}
		seen[k] = true
		if info.Hashed {
			f.hashed++
			continue
		}
		if _, ok := f.limiters[id]; !ok {
			p, err := a.policyOf(client, info, inCode)
			if err != nil {
				return found{}, err
			}
			var l *limiter
			if p.known() {
				if l, err = newLimiter(client, a.prefix, p); err != nil {
					return found{}, err
				}
			}
			f.limiters[id] = l
		}
		if f.limiters[id] == nil {
			f.unknown++
			continue
		}
		f.keys = append(f.keys, k)
	}
	return f, nil
}

// policyOf returns the policy of a scanned key's limiter (see
// lookUpPolicy); one not known when nothing says it.
func (a *app) policyOf(client redis.UniversalClient, info keyInfo, inCode map[string]string) (policy, error) {
	ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
	defer cancel()
	return a.lookUpPolicy(ctx, client, info.Name, "", inCode)
}

// lookUpPolicy returns the policy in force for the limiter called name and
// caller ("" for the limiter's own): the one stored for it (throttlectl
// set), unless the registry of names says its limiters are not live, else
// the one its processes recorded in the registry (the policy in code),
// else the one inCode (--config) gives; a policy not known, with its name
// only, when none does.
func (a *app) lookUpPolicy(ctx context.Context, client redis.UniversalClient, name, caller string, inCode map[string]string) (policy, error) {
	p := policy{name: name}
	value, err := client.HGet(ctx, keyspace.Registry(a.prefix), name).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return policy{}, err
	}
	entry, registered := keyspace.RegistryEntry(value)
	form, live := entry.Policy, entry.Live
	if !registered || live {
		// A stored policy is in force, for limiters that apply them (or
		// when nothing says they do not).
		stored, err := storedPolicy(ctx, client, a.prefix, name, caller)
		if err != nil {
			return policy{}, err
		}
		if stored != nil {
			p.rate, p.source, p.rules, p.leased, p.live = stored, "stored", entry.Rules, entry.Leased, true
			return p, nil
		}
	}
	if registered {
		if p, err = parsePolicy(form); err != nil {
			return policy{}, fmt.Errorf("the registry of names holds %q for the limiter %q: %w", form, name, err)
		}
		p.name, p.source, p.rules, p.leased, p.live = name, "code", entry.Rules, entry.Leased, live
		return p, nil
	}
	if inCode[name] != "" {
		if p, err = parsePolicy(inCode[name]); err != nil {
			return policy{}, usagef("--config, limiter %q: %v", name, err)
		}
		p.name, p.source = name, "--config"
	}
	return p, nil
}

// peekers is how many keys top peeks at once; the limiters share round
// trips between them.
const peekers = 16

// peekAll peeks every key found, each within the --timeout.
func (a *app) peekAll(f found) ([]state, error) {
	states := make([]state, len(f.keys))
	errs := make([]error, len(f.keys))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(peekers, len(f.keys)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
				k := f.keys[i]
				states[i], errs[i] = f.limiters[k.policy].peek(ctx, k.caller)
				cancel()
			}
		}()
	}
	for i := range f.keys {
		next <- i
	}
	close(next)
	wg.Wait()
	failed := 0
	var first error
	for _, err := range errs {
		if err != nil {
			failed++
			first = cmp.Or(first, err)
		}
	}
	if failed > 0 {
		return nil, fmt.Errorf("top: %d of %d keys could not be peeked; the first: %w", failed, len(f.keys), first)
	}
	return states, nil
}

// sortByWait puts the longest wait first (RETRY-AFTER or BLOCKED-FOR),
// then the longest RESET-AFTER, then the Redis keys in order.
func sortByWait(states []state) {
	slices.SortFunc(states, func(x, y state) int {
		if c := cmp.Compare(y.wait(), x.wait()); c != 0 {
			return c
		}
		if c := cmp.Compare(y.resetAfter, x.resetAfter); c != 0 {
			return c
		}
		return cmp.Compare(x.redisKey, y.redisKey)
	})
}
