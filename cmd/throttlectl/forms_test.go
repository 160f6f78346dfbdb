package main

import (
	"math"
	"strings"
	"testing"
	"time"
	_ "time/tzdata" // the zone database, whatever the machine has

	"github.com/jobthrottle/jobthrottle/throttle"
)

// TestPolicyFormsRoundTrip: every form Policy.String prints reads back to
// the same policy, and so do the forms the docs write ("10/s").
func TestPolicyFormsRoundTrip(t *testing.T) {
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	spans := []time.Duration{time.Millisecond, 250 * time.Millisecond, time.Second, 1500 * time.Millisecond, time.Minute, 90 * time.Second, time.Hour, 90 * time.Minute, 24 * time.Hour, decade}
	var policies []throttle.Policy
	for _, per := range spans {
		rate := throttle.Rate{N: 10, Per: per}
		policies = append(policies,
			throttle.GCRA{Rate: rate, Burst: 5}, throttle.TokenBucket{Rate: rate, Burst: 3}, throttle.LeakyBucket{Rate: rate, Capacity: 7},
			throttle.FixedWindow{Limit: 25, Window: per}, throttle.SlidingLog{Limit: 25, Window: per}, throttle.SlidingWindow{Limit: 25, Window: per})
	}
	policies = append(policies, throttle.Quota{Limit: 1000, Period: throttle.Day}, throttle.Quota{Limit: 5, Period: throttle.Month, Location: paris})
	for _, p := range policies {
		if p.Validate() != nil {
			continue // a window too short for its kind
		}
		got, err := parsePolicy(p.String())
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		if got.rate.String() != p.String() || (!isQuota(p) && got.rate != p) {
			t.Errorf("%s read back as %#v, want %#v", p, got.rate, p)
		}
	}

	for _, tc := range []struct {
		form string
		want string // as Policy.String prints it, or a concurrency cap as its keys have it
	}{
		{"gcra:10/s:5", "gcra:10/1s:5"},
		{"gcra:10/1s:5", "gcra:10/1s:5"},
		{"tb:25/m:25", "tb:25/1m:25"},
		{"lb:5/h:5", "lb:5/1h:5"},
		{"gcra:100/ms:1", "gcra:100/1ms:1"},
		{"fw:25/1m", "fw:25/1m"},
		{"fw:25/1m0s", "fw:25/1m"},
		{"sl:25/m", "sl:25/1m"},
		{"sw:25/s", "sw:25/1s"},
		{"quota:1000/day", "quota:1000/day:UTC"},
		{"quota:1000/month:Europe/Paris", "quota:1000/month:Europe/Paris"},
		{"conc:3/30s", "conc:3/30s"},
		{"conc:3/m", "conc:3/1m0s"},
	} {
		p, err := parsePolicy(tc.form)
		if err != nil {
			t.Errorf("%s: %v", tc.form, err)
			continue
		}
		got := concurrencyForm(p.conc)
		if p.rate != nil {
			got = p.rate.String()
		}
		if got != tc.want {
			t.Errorf("%s read as %s, want %s", tc.form, got, tc.want)
		}
	}
}

func isQuota(p throttle.Policy) bool { _, ok := p.(throttle.Quota); return ok }

// TestPolicyFormsRefused: what is no policy is refused with the form given.
func TestPolicyFormsRefused(t *testing.T) {
	for form, says := range map[string]string{
		"gcra:10/s":                    "want N/PER:CAPACITY",
		"gcra:10/sec:5":                `bad duration "1sec"`,
		"fw:25/":                       "bad duration",
		"conc:3":                       `"conc:3": want conc:LIMIT/LEASE`,
		"conc:x/30s":                   "want a whole number of holders",
		"conc:0/30s":                   "Concurrency.Limit must be at least 1",
		"conc:3/soon":                  `bad lease "soon"`,
		"conc:99999999999999999999/1s": "out of range",
	} {
		_, err := parsePolicy(form)
		if err == nil || !strings.Contains(err.Error(), says) || !strings.Contains(err.Error(), "invalid policy") {
			t.Errorf("%s: error %v, want one saying %q", form, err, says)
		}
	}
}

// TestThrottlectlDocForms: the CLI takes a policy as the docs write it and
// shows its rate and burst; set stores one.
func TestThrottlectlDocForms(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	// 10 a minute: the key's state lasts 6s, time enough to start the
	// command on a busy machine (at 10/s it lasted 100ms, and CI's cluster
	// pass once found it gone)
	take(t, c.limiter(throttle.GCRA{Rate: throttle.PerMinute(10), Burst: 1}), "tenant-1", 1)
	var got peekJSON
	c.okJSON(&got, "peek", "--name", pol("gcra:10/m:1"), "--policy", "gcra:10/m:1", "tenant-1")
	if got.Policy != "gcra:10/1m:1" || got.Rate != "10/1m" || math.Abs(got.RatePerSecond-10.0/60) > 1e-9 || got.Burst != 1 || got.Limit != 1 {
		t.Errorf("peek --policy gcra:10/m:1: %+v", got)
	}
	r := c.ok("set", "--new", "exports", "gcra:20/s:20")
	if !strings.Contains(r.stdout, "gcra:20/1s:20") {
		t.Errorf("set gcra:20/s:20 shows %q", r.stdout)
	}
}
