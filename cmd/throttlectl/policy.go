package main

import (
	"encoding/json"
	"os"
	"slices"
	"strings"

	"github.com/jobthrottle/jobthrottle/throttle"
)

// policy is a limiter's policy as the command line or a key names it: a
// rate policy, or a concurrency cap, which the library keeps as a type of
// its own.
type policy struct {
	rate throttle.Policy      // nil for a concurrency cap, or before the policy is looked up
	conc throttle.Concurrency // zero for a rate policy
	name string               // the limiter's name
	// source says where the policy comes from: "stored" (throttlectl set),
	// "code" (the registry of names), "--policy" or "--config".
	source string
	rules  []string // the worker's rules that use the limiter (the registry's)
	leased bool     // its limiters decide from leased shares (the registry's)
	// live: its limiters apply stored policies, the limiter's and each
	// key's (stored, or the registry says so)
	live bool
}

// known reports whether the policy is known, not only the name.
func (p policy) known() bool { return p.rate != nil || p.conc.Limit > 0 }

// parsePolicy reads a policy in its short form ("gcra:10/1s:5",
// "gcra:10/s:5", "conc:3/30s"; see forms.go).
func parsePolicy(s string) (policy, error) {
	if strings.HasPrefix(s, "conc:") {
		c, err := parseConcurrency(s)
		return policy{conc: c}, err
	}
	p, err := parseRatePolicy(s)
	return policy{rate: p}, err
}

// target is what peek and reset work on: a limiter's policy and a caller
// key.
type target struct {
	policy policy
	caller string
}

// resolveTarget reads the limiter and caller key a command names: KEY with
// --policy, KEY with --config and --limiter, or a full Redis key under the
// prefix.
func (a *app) resolveTarget(pf policyFlags, operand string) (target, error) {
	switch {
	case pf.name != "" && (pf.config != "" || pf.limiter != ""):
		return target{}, usagef("%s: give --name, with --policy or without, or --config with --limiter, not both", a.command.name)
	case pf.name != "":
		p, err := namedPolicy(pf.name, pf.policy)
		return target{p, operand}, err
	case pf.policy != "" && (pf.config != "" || pf.limiter != ""):
		return target{}, usagef("%s: give --policy, or --config with --limiter, not both", a.command.name)
	case pf.policy != "":
		return target{}, usagef("%s: --policy needs the limiter's name, --name NAME: a limiter's keys carry its name", a.command.name)
	case pf.config != "" || pf.limiter != "":
		p, err := policyFromConfig(pf.config, pf.limiter)
		if err != nil {
			return target{}, err
		}
		p.name = pf.limiter
		return target{p, operand}, nil
	}
	info, err := parseKey(a.prefix, operand)
	if err != nil {
		return target{}, usagef("%s %q: name its limiter with --name (and --policy, if its processes have not registered it), or --config and --limiter; or give a limiter's Redis key under the prefix %q, as top lists it", a.command.name, operand, a.prefix)
	}
	if info.Hashed {
		return target{}, usagef("%s %q: the caller key is stored by its hash (WithKeyHashing), which throttlectl cannot address", a.command.name, operand)
	}
	p, err := namedPolicy(info.Name, pf.policy)
	return target{p, info.Caller}, err
}

// namedPolicy is the policy of the limiter named name: the one --policy
// gives (flag, its policy in code), or, when flag is "", the one stored
// for it, looked up once connected (rate nil).
func namedPolicy(name, flag string) (policy, error) {
	p := policy{name: name}
	if flag == "" {
		return p, nil
	}
	p, err := parsePolicy(flag)
	if err != nil {
		return policy{}, usagef("--policy: %v", err)
	}
	p.name, p.source = name, "--policy"
	return p, nil
}

// limiterID names a limiter as its keys do: its name and algorithm.
func limiterID(info keyInfo) string { return info.Name + "@" + info.Algorithm }

// policyFromConfig reads the policy named limiter from the JSON file at
// path, an object of names and policies:
//
//	{"tenant": "gcra:10/1s:5", "exports": "conc:3/30s"}
func policyFromConfig(path, limiter string) (policy, error) {
	switch {
	case path == "":
		return policy{}, usagef("--limiter needs --config FILE")
	case limiter == "":
		return policy{}, usagef("--config needs --limiter NAME")
	}
	named, err := readConfig(path)
	if err != nil {
		return policy{}, err
	}
	s, ok := named[limiter]
	if !ok {
		names := make([]string, 0, len(named))
		for name := range named {
			names = append(names, name)
		}
		slices.Sort(names)
		return policy{}, usagef("--config %s has no limiter %q (it has %q)", path, limiter, names)
	}
	p, err := parsePolicy(s)
	if err != nil {
		return policy{}, usagef("--config %s, limiter %q: %v", path, limiter, err)
	}
	p.source = "--config"
	return p, nil
}

// readConfig reads a --config file: a JSON object of limiter names and
// policies.
func readConfig(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, usagef("--config: %v", err)
	}
	var named map[string]string
	if err := json.Unmarshal(data, &named); err != nil {
		return nil, usagef("--config %s: want a JSON object of limiter names and policy strings: %v", path, err)
	}
	return named, nil
}
