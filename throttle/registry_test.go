package throttle_test

import (
	"context"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// TestLimitersRecordTheirNames: a limiter records its name, its policy in
// code and whether it is live in the registry of names on its first
// decision, in the background; the hash has a TTL; a tool's view of a
// limiter (keyspace.Inspecting) records nothing.
func TestLimitersRecordTheirNames(t *testing.T) {
	tg := redistest.New(t)
	ctx := context.Background()
	partner := newNamedLimiter(t, tg, "partner-api", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 5}, throttle.WithLivePolicies())
	emails := newNamedLimiter(t, tg, "emails", throttle.FixedWindow{Limit: 100, Window: time.Hour})
	exports := newNamedConcurrency(t, tg, "exports", throttle.Concurrency{Limit: 3, Lease: 30 * time.Second})
	tool, err := throttle.New(tg.Client, "tool", throttle.GCRA{Rate: throttle.PerSecond(1), Burst: 1},
		throttle.WithPrefix(tg.Prefix), keyspace.Inspecting.(throttle.Option))
	if err != nil {
		t.Fatal(err)
	}
	registry := keyspace.Registry(tg.Prefix)
	if n, err := tg.Client.Exists(ctx, registry).Result(); err != nil || n != 0 {
		t.Fatalf("the registry exists before any decision: %d, %v", n, err)
	}
	allowN(t, partner, "tenant-1", 1)
	allowN(t, emails, "tenant-1", 1)
	allowN(t, tool, "tenant-1", 1)
	lease, _, err := exports.Acquire(ctx, "tenant-1")
	if err != nil || lease == nil {
		t.Fatalf("Acquire: %v", err)
	}
	defer lease.Release(ctx)
	want := map[string]keyspace.Entry{
		"partner-api": {Policy: "gcra:10/1s:5", Live: true},
		"emails":      {Policy: "fw:100/1h"},
		"exports":     {Policy: "conc:3/30s"},
	}
	var got map[string]string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if got, err = tg.Client.HGetAll(ctx, registry).Result(); err != nil {
			t.Fatal(err)
		}
		if len(got) >= len(want) || time.Now().After(deadline) {
			break
		}
	}
	if len(got) != len(want) {
		t.Fatalf("registry %v, want %v", got, want)
	}
	for name, entry := range want {
		if e, ok := keyspace.RegistryEntry(got[name]); !ok || e.Policy != entry.Policy || e.Live != entry.Live || len(e.Rules) != 0 {
			t.Errorf("registry entry of %q: %q, want %+v", name, got[name], entry)
		}
	}
	e, _ := keyspace.RegistryEntry(got["partner-api"])
	if p, err := throttle.ParsePolicy(e.Policy); err != nil || p != partner.Policy() {
		t.Errorf("partner-api's entry reads back as %v, %v", p, err)
	}
	if ttl := tg.Client.TTL(ctx, registry).Val(); ttl < 29*24*time.Hour {
		t.Errorf("the registry's TTL is %s, want about 30 days", ttl)
	}
}
