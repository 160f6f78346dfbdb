package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jobthrottle/jobthrottle/throttle"
)

// This file reads policies as an operator writes them: the library's short
// form ("gcra:10/1s:5", what Policy.String prints and the Redis keys
// carry), with a period written as a bare unit as the docs write rates
// ("gcra:10/s:5", "fw:25/m"), and concurrency caps ("conc:3/30s").

// parseRatePolicy reads a rate policy with throttle.ParsePolicy, after
// giving a bare unit its count: "10/s" is "10/1s".
func parseRatePolicy(s string) (throttle.Policy, error) {
	return throttle.ParsePolicy(s)
}

// withUnitCount writes the period of a policy's "COUNT/PERIOD" part with a
// count when it is a bare unit: "gcra:10/s:5" becomes "gcra:10/1s:5",
// "fw:25/m" "fw:25/1m". Anything else, quotas ("quota:1000/day:UTC")
// included, is returned as it is.
func withUnitCount(s string) string {
	kind, rest, ok := strings.Cut(s, ":")
	if !ok || kind == "quota" {
		return s
	}
	slash := strings.IndexByte(rest, '/')
	if slash < 0 || slash+1 >= len(rest) {
		return s
	}
	if c := rest[slash+1]; c < 'a' || c > 'z' {
		return s
	}
	return kind + ":" + rest[:slash+1] + "1" + rest[slash+1:]
}

// parseConcurrency reads a concurrency cap, "conc:LIMIT/LEASE" as a
// ConcurrencyLimiter writes it in its keys ("conc:3/30s"), LEASE a
// duration, or a bare unit ("conc:3/m"). Errors wrap
// throttle.ErrInvalidPolicy.
func parseConcurrency(s string) (throttle.Concurrency, error) {
	rest, ok := strings.CutPrefix(withUnitCount(s), "conc:")
	limitText, leaseText, found := strings.Cut(rest, "/")
	if !ok || !found {
		return throttle.Concurrency{}, fmt.Errorf("%w: %q: want conc:LIMIT/LEASE, e.g. conc:3/30s", throttle.ErrInvalidPolicy, s)
	}
	if limitText == "" || strings.Trim(limitText, "0123456789") != "" {
		return throttle.Concurrency{}, fmt.Errorf("%w: %q: want a whole number of holders, got %q", throttle.ErrInvalidPolicy, s, limitText)
	}
	limit, err := strconv.Atoi(limitText)
	if err != nil {
		return throttle.Concurrency{}, fmt.Errorf("%w: %q: number %q out of range", throttle.ErrInvalidPolicy, s, limitText)
	}
	lease, err := time.ParseDuration(leaseText)
	if err != nil {
		_, given, _ := strings.Cut(s, "/")
		return throttle.Concurrency{}, fmt.Errorf("%w: %q: bad lease %q: want a duration such as 30s", throttle.ErrInvalidPolicy, s, given)
	}
	p := throttle.Concurrency{Limit: limit, Lease: lease}
	if err := p.Validate(); err != nil {
		return throttle.Concurrency{}, fmt.Errorf("%w (in %q)", err, s)
	}
	return p, nil
}

// concurrencyForm is a concurrency cap's short form, as its keys carry it.
func concurrencyForm(p throttle.Concurrency) string {
	return "conc:" + strconv.Itoa(p.Limit) + "/" + p.Lease.String()
}
