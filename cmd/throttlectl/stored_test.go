package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// TestSetGetUnset: an operator stores a named limiter's policy and one
// caller key's, reads them back (table and --json), and removes them; what
// cannot apply is refused with exit status 2 and stores nothing; a running
// limiter of that name applies what was stored. Rates are per hour, so
// that the key's state outlives the test's runs of the binary.
func TestSetGetUnset(t *testing.T) {
	c := newCLI(t)
	ctx := context.Background()
	l, err := throttle.New(c.tg.Client, "partner-api", throttle.GCRA{Rate: throttle.PerHour(10), Burst: 10},
		throttle.WithPrefix(c.tg.Prefix), throttle.WithLivePolicies())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Allow(ctx, "tenant-1"); err != nil { // the limiter reads the store
		t.Fatal(err)
	}
	c.waitRegistered(1)

	r := c.ok("set", "partner-api", "gcra:20/1h:20")
	if !strings.Contains(r.stdout, "gcra:20/1h:20") || !strings.Contains(r.stdout, "within a second") {
		t.Errorf("set shows: %v", r)
	}
	c.ok("set", "--key", "vip", "partner-api", "gcra:50/1h:50")
	var got jsonStored
	c.okJSON(&got, "get", "partner-api")
	if got.Limiter != "partner-api" || got.Algorithm != "gcra" || got.Policy != "gcra:20/1h:20" ||
		got.Keys["vip"] != "gcra:50/1h:50" || len(got.Keys) != 1 || got.Version != 2 {
		t.Errorf("get --json = %+v", got)
	}
	// A process starting now reads the store before its first decision.
	fresh, err := throttle.New(c.tg.Client, "partner-api", throttle.GCRA{Rate: throttle.PerHour(10), Burst: 10},
		throttle.WithPrefix(c.tg.Prefix), throttle.WithLivePolicies())
	if err != nil {
		t.Fatal(err)
	}
	if p, err := fresh.PolicyFor(ctx, "vip"); err != nil || p.String() != "gcra:50/1h:50" {
		t.Errorf("the limiter applies %v, %v for vip; want gcra:50/1s:50", p, err)
	}

	// peek finds the named limiter's key with the stored policy.
	var peeked jsonState
	c.okJSON(&peeked, "peek", "--name", "partner-api", "tenant-1")
	if peeked.Limiter != "partner-api" || peeked.Policy != "gcra:20/1h:20" || peeked.Limit != 20 || peeked.Remaining != 19 {
		t.Errorf("peek --name = %+v", peeked)
	}
	c.okJSON(&peeked, "peek", l.Key("tenant-1"))
	if peeked.Limiter != "partner-api" || peeked.Policy != "gcra:20/1h:20" {
		t.Errorf("peek of the Redis key = %+v", peeked)
	}

	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"set", "partner-api", "fw:10/1s"}, "--replace"},
		{[]string{"set", "--replace", "--key", "vip", "partner-api", "fw:10/1s"}, "not of one --key"},
		{[]string{"set", "partner-api", "gcra:0/1s:1"}, "invalid policy"},
		{[]string{"set", "partner-api"}, "want NAME POLICY"},
		{[]string{"set", "a{b}", "gcra:1/1s:1"}, "must not contain"},
		{[]string{"get"}, "missing NAME"},
		// A name no limiter has used under the prefix: a typo, or the
		// wrong --prefix.
		{[]string{"get", "partner-apj"}, `no limiter called "partner-apj" has decided under the prefix`},
		{[]string{"set", "partner-apj", "gcra:1/1s:1"}, "give --new"},
		{[]string{"unset", "partner-apj"}, `no limiter called "partner-apj"`},
	} {
		fails(t, c.run(tc.args...), 2, tc.says)
	}
	// Limiters about to start: --new stores it all the same.
	c.ok("set", "--new", "partner-apk", "gcra:1/1s:1")
	c.ok("get", "partner-apk")
	// A limiter that does not apply stored policies is told of.
	plain, err := throttle.New(c.tg.Client, "plain", throttle.GCRA{Rate: throttle.PerHour(10), Burst: 10}, throttle.WithPrefix(c.tg.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Allow(ctx, "tenant-1"); err != nil {
		t.Fatal(err)
	}
	waitRegistered(t, c.tg.Client, c.tg.Prefix, 2)
	if r := c.run("set", "plain", "gcra:20/1h:20"); r.code != 0 || !strings.Contains(r.stderr, "do not apply stored policies") {
		t.Errorf("set for limiters that are not live: %v", r)
	}
	// What is in force for them is their policy in code, not the stored one.
	var plainPeek jsonState
	c.okJSON(&plainPeek, "peek", "--name", "plain", "tenant-1")
	if plainPeek.Policy != "gcra:10/1h:10" {
		t.Errorf("peek of a limiter that is not live, with a policy stored: %+v", plainPeek)
	}

	c.ok("unset", "partner-api")
	c.ok("unset", "--key", "vip", "partner-api")
	var after jsonStored
	c.okJSON(&after, "get", "partner-api")
	if after.Policy != "" || len(after.Keys) != 0 || after.Version != 4 {
		t.Errorf("after unset, get --json = %+v", after)
	}
	// With nothing stored, peek finds the policy in code in the registry
	// of names; not a name no limiter has used.
	c.waitRegistered(1)
	c.okJSON(&peeked, "peek", "--name", "partner-api", "tenant-1")
	if peeked.Policy != "gcra:10/1h:10" || peeked.Limit != 10 {
		t.Errorf("peek --name with nothing stored = %+v", peeked)
	}
	fails(t, c.run("peek", "--name", "partner-apj", "tenant-1"), 2, `no limiter called "partner-apj" has decided under the prefix`)
	c.okJSON(&peeked, "peek", "--name", "partner-api", "--policy", "gcra:10/1h:10", "tenant-1")
	if peeked.Policy != "gcra:10/1h:10" || peeked.Limit != 10 {
		t.Errorf("peek --name --policy = %+v", peeked)
	}

	// The fleet moves the name to FixedWindow: set --replace.
	c.ok("set", "partner-api", "gcra:20/1h:20")
	c.ok("set", "--key", "vip", "partner-api", "gcra:50/1h:50")
	c.ok("set", "--replace", "partner-api", "fw:10/1s")
	var replaced jsonStored
	c.okJSON(&replaced, "get", "partner-api")
	if replaced.Algorithm != "fw" || replaced.Policy != "fw:10/1s" || len(replaced.Keys) != 0 {
		t.Errorf("after set --replace, get --json = %+v", replaced)
	}
}

// TestTopPeeksNamedLimiters: top lists a named limiter's throttled key
// with the policy stored for it, or the one --config gives.
func TestTopPeeksNamedLimiters(t *testing.T) {
	c := newCLI(t)
	ctx := context.Background()
	l, err := throttle.New(c.tg.Client, "exports", throttle.GCRA{Rate: throttle.PerMinute(1), Burst: 1},
		throttle.WithPrefix(c.tg.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Allow(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	// Known from the registry of names, where the limiter records its
	// policy in code.
	c.waitRegistered(1)
	var listed []jsonState
	c.okJSON(&listed, "top")
	if len(listed) != 1 || listed[0].Key != "acme" || listed[0].Limiter != "exports" || listed[0].Policy != "gcra:1/1m:1" || listed[0].PolicySource != "code" || !listed[0].Throttled {
		t.Errorf("top = %+v", listed)
	}
	// Known from --config only: nothing in the registry.
	if err := c.tg.Client.Del(ctx, keyspace.Registry(c.tg.Prefix)).Err(); err != nil {
		t.Fatal(err)
	}
	r := c.run("top")
	if r.code != 0 || !strings.Contains(r.stderr, "whose policy is not known") {
		t.Errorf("top with no policy known for the name: %v", r)
	}
	config := filepath.Join(t.TempDir(), "limits.json")
	writeJSON(t, config, map[string]string{"exports": "gcra:1/1m:1"})
	c.okJSON(&listed, "top", "--config", config)
	if len(listed) != 1 || listed[0].Key != "acme" || listed[0].Limiter != "exports" || listed[0].Policy != "gcra:1/1m:1" || listed[0].PolicySource != "--config" || !listed[0].Throttled {
		t.Errorf("top --config = %+v", listed)
	}
	c.ok("set", "--new", "exports", "gcra:2/1m:2") // the registry is gone: nothing says the name is used
	c.okJSON(&listed, "top", "--all")
	if len(listed) != 1 || listed[0].Policy != "gcra:2/1m:2" || listed[0].PolicySource != "stored" || listed[0].Remaining != 1 {
		t.Errorf("top with a stored policy = %+v", listed)
	}
	// A key's own stored policy is the one its row reads under.
	c.ok("set", "--key", "acme", "exports", "gcra:5/1m:5")
	c.okJSON(&listed, "top", "--all")
	if len(listed) != 1 || listed[0].Policy != "gcra:5/1m:5" || listed[0].PolicySource != "stored" || listed[0].Remaining != 4 {
		t.Errorf("top with a policy stored for the key = %+v", listed)
	}
}
