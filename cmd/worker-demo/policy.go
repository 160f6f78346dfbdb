package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/jobthrottle/jobthrottle/throttle"
)

// algorithm is a policy the demo can run at a rate per second.
type algorithm struct {
	name   string
	policy func(rate int) throttle.Policy
	// allows is the most calls the policy lets through within any closed
	// one-second window, and why.
	allows func(rate int) (int, string)
	// meter: a rate rule (GCRA, TokenBucket), whose limit can be shared
	// fairly.
	meter bool
}

var algorithms = []algorithm{
	{"gcra", func(r int) throttle.Policy { return throttle.GCRA{Rate: throttle.PerSecond(r), Burst: 1} }, meterAllows, true},
	{"token-bucket", func(r int) throttle.Policy { return throttle.TokenBucket{Rate: throttle.PerSecond(r), Burst: 1} }, meterAllows, true},
	{"leaky-bucket", func(r int) throttle.Policy { return throttle.LeakyBucket{Rate: throttle.PerSecond(r), Capacity: 1} }, meterAllows, false},
	{"sliding-log", func(r int) throttle.Policy { return throttle.SlidingLog{Limit: r, Window: time.Second} },
		func(r int) (int, string) {
			return r + 1, "the limit in any window; a closed second can hold one more at its edge"
		}, false},
	{"sliding-window", func(r int) throttle.Policy { return throttle.SlidingWindow{Limit: r, Window: time.Second} },
		func(r int) (int, string) {
			return 2 * r, "an estimate that assumes the previous window's calls were spread evenly"
		}, false},
	{"fixed-window", func(r int) throttle.Policy { return throttle.FixedWindow{Limit: r, Window: time.Second} },
		func(r int) (int, string) {
			return 2 * r, "the limit per window; two full windows meet at each boundary"
		}, false},
}

func meterAllows(r int) (int, string) { return r + 1, "the rate plus its burst of 1" }

func algorithmNames() string {
	var names []string
	for _, a := range algorithms {
		names = append(names, a.name)
	}
	return strings.Join(names, ", ")
}

func lookupAlgorithm(name string) (algorithm, error) {
	for _, a := range algorithms {
		if a.name == name {
			return a, nil
		}
	}
	return algorithm{}, fmt.Errorf("unknown algorithm %q; choose one of %s", name, algorithmNames())
}
