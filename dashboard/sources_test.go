package dashboard_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/dashboard"
	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// serveDashboard serves a read-only dashboard of tgt's prefix.
func serveDashboard(t *testing.T, tgt *redistest.Target, opts ...dashboard.Option) *site {
	t.Helper()
	h, err := dashboard.New(tgt.Client, append([]dashboard.Option{dashboard.WithPrefix(tgt.Prefix), dashboard.WithLogger(nil)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	s := &site{tgt: tgt}
	s.srv = httptestServer(t, http.StripPrefix("/ops", h))
	return s
}

// TestDashboardNamedConcurrencyCap: a cap's keys carry its policy, not its
// name; the dashboard lists it once, under its name, with its keys and
// the leases held.
func TestDashboardNamedConcurrencyCap(t *testing.T) {
	tgt := redistest.New(t)
	ctx := context.Background()
	pub, err := dashboard.NewPublisher(tgt.Client, dashboard.WithPublishPrefix(tgt.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	pool, err := throttle.NewConcurrencyLimiter(tgt.Client, "pool", throttle.Concurrency{Limit: 2, Lease: time.Minute},
		throttle.WithPrefix(tgt.Prefix), throttle.WithObserver(pub))
	if err != nil {
		t.Fatal(err)
	}
	lease, _, err := pool.Acquire(ctx, "exports")
	if err != nil || lease == nil {
		t.Fatalf("Acquire: %v", err)
	}
	defer lease.Release(ctx)
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	s := serveDashboard(t, tgt)
	var overview struct {
		Limiters []struct {
			Name, Kind, Policy string
			Keys               int
		}
	}
	s.getJSON(t, "/ops/api/overview", &overview)
	if len(overview.Limiters) != 1 || overview.Limiters[0].Name != "pool" || overview.Limiters[0].Kind != "concurrency" ||
		overview.Limiters[0].Policy != "conc:2/1m0s" || overview.Limiters[0].Keys != 1 {
		t.Fatalf("overview: %+v; want the cap once, as pool, conc:2/1m0s, 1 key", overview.Limiters)
	}
	var keys struct {
		Rows []struct {
			Key           string
			Known         bool
			Leases, Limit int
			Admitted      int64
		}
	}
	s.getJSON(t, "/ops/api/keys?"+q("name", "pool"), &keys)
	if len(keys.Rows) != 1 || keys.Rows[0].Key != "exports" || !keys.Rows[0].Known || keys.Rows[0].Leases != 1 ||
		keys.Rows[0].Limit != 2 || keys.Rows[0].Admitted != 1 {
		t.Fatalf("keys: %+v; want exports holding 1 lease of 2, 1 admitted", keys.Rows)
	}
}

// TestDashboardPlanKey: a key whose policy the code's plan chose is shown,
// on its page, under that policy.
func TestDashboardPlanKey(t *testing.T) {
	tgt := redistest.New(t)
	ctx := context.Background()
	pub, err := dashboard.NewPublisher(tgt.Client, dashboard.WithPublishPrefix(tgt.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	vip := throttle.GCRA{Rate: throttle.PerMinute(10), Burst: 5} // no unit comes back while the test reads
	l, err := throttle.New(tgt.Client, "plans", throttle.GCRA{Rate: throttle.PerMinute(1), Burst: 1},
		throttle.WithPrefix(tgt.Prefix), throttle.WithObserver(pub),
		throttle.WithPlan(func(_ context.Context, key string) throttle.Policy {
			if key == "vip" {
				return vip
			}
			return nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"vip", "basic"} {
		if _, err := l.Allow(ctx, key); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	s := serveDashboard(t, tgt)
	for _, tc := range []struct {
		key, policy, source string
		limit               int
	}{
		{"vip", "gcra:10/1m:5", "the code's plan for this key", 5},
		{"basic", "gcra:1/1m:1", "code", 1},
	} {
		var key struct {
			State struct {
				Policy, Source   string
				Limit, Remaining int
			}
		}
		s.getJSON(t, "/ops/api/key?"+q("name", "plans", "key", tc.key), &key)
		if key.State.Policy != tc.policy || key.State.Source != tc.source || key.State.Limit != tc.limit || key.State.Remaining != tc.limit-1 {
			t.Errorf("%s: %+v; want %s from %s, %d of %d left", tc.key, key.State, tc.policy, tc.source, tc.limit-1, tc.limit)
		}
	}
}

// TestDashboardReadsALiveLimiterUnderItsStoredPolicies: the keys of a live
// limiter (throttle.WithLivePolicies) are read under the policies its
// processes apply, the one stored for its name and one stored for a key,
// not under the policy in code.
func TestDashboardReadsALiveLimiterUnderItsStoredPolicies(t *testing.T) {
	tgt := redistest.New(t)
	ctx := context.Background()
	store, err := throttle.NewPolicyStore(tgt.Client, tgt.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Set(ctx, "partner-api", throttle.GCRA{Rate: throttle.PerMinute(20), Burst: 20}); err != nil {
		t.Fatal(err)
	}
	if err := store.Set(ctx, "partner-api", throttle.GCRA{Rate: throttle.PerMinute(50), Burst: 50}, "vip"); err != nil {
		t.Fatal(err)
	}
	pub, err := dashboard.NewPublisher(tgt.Client, dashboard.WithPublishPrefix(tgt.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	l, err := throttle.New(tgt.Client, "partner-api", throttle.GCRA{Rate: throttle.PerMinute(10), Burst: 10},
		throttle.WithPrefix(tgt.Prefix), throttle.WithObserver(pub), throttle.WithLivePolicies())
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"vip", "basic"} {
		if r, err := l.Allow(ctx, key); err != nil || !r.Allowed {
			t.Fatalf("Allow(%s): %+v, %v", key, r, err)
		}
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	registered(t, tgt, "partner-api") // which says it applies stored policies
	s := serveDashboard(t, tgt)
	for _, tc := range []struct {
		key, policy string
		limit       int
	}{
		{"vip", "gcra:50/1m:50", 50},
		{"basic", "gcra:20/1m:20", 20},
	} {
		var key struct {
			State struct {
				Policy           string
				Limit, Remaining int
			}
		}
		s.getJSON(t, "/ops/api/key?"+q("name", "partner-api", "key", tc.key), &key)
		if key.State.Policy != tc.policy || key.State.Limit != tc.limit || key.State.Remaining != tc.limit-1 {
			t.Errorf("%s: %+v; want %s, %d of %d left", tc.key, key.State, tc.policy, tc.limit-1, tc.limit)
		}
	}
}

// registered waits until the limiter named name has written its entry in
// the registry of names, which it does in the background after its first
// decision: under a busy machine, a moment later.
func registered(t *testing.T, tgt *redistest.Target, name string) {
	t.Helper()
	key := keyspace.Registry(tgt.Prefix)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		ok, err := tgt.Client.HExists(context.Background(), key, name).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s, limiter %s has not written its entry in the registry", name)
		}
	}
}

// TestCodePoliciesGivenFillInOnly: a policy given with WithCodePolicies
// (a file of limits, say) stands for a limiter that records nothing, and
// gives way to the policy a limiter's processes record themselves.
func TestCodePoliciesGivenFillInOnly(t *testing.T) {
	tgt := redistest.New(t)
	ctx := context.Background()
	l, err := throttle.New(tgt.Client, "partner-api", throttle.GCRA{Rate: throttle.PerMinute(50), Burst: 50}, throttle.WithPrefix(tgt.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Allow(ctx, "tenant-1"); err != nil { // its first decision records it
		t.Fatal(err)
	}
	registered(t, tgt, "partner-api")
	stale := throttle.GCRA{Rate: throttle.PerMinute(10), Burst: 5}
	s := serveDashboard(t, tgt, dashboard.WithCodePolicies(map[string]throttle.Policy{"partner-api": stale, "exports": stale}))
	var overview struct {
		Limiters []struct{ Name, CodePolicy string }
	}
	s.getJSON(t, "/ops/api/overview", &overview)
	want := map[string]string{"partner-api": "gcra:50/1m:50", "exports": "gcra:10/1m:5"}
	if len(overview.Limiters) != len(want) {
		t.Fatalf("overview: %+v; want %v", overview.Limiters, want)
	}
	for _, v := range overview.Limiters {
		if v.CodePolicy != want[v.Name] {
			t.Errorf("%s: in code %s; want %s", v.Name, v.CodePolicy, want[v.Name])
		}
	}
}

// TestDashboardHidesRedisErrors: when Redis cannot answer, the page says
// so without naming Redis's address.
func TestDashboardHidesRedisErrors(t *testing.T) {
	addr := redistest.DeadAddr(t)
	client := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	defer client.Close()
	h, err := dashboard.New(client, dashboard.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	s := &site{srv: httptestServer(t, h)}
	status, body := s.get(t, "/api/overview")
	if status != http.StatusBadGateway || strings.Contains(body, addr) || !strings.Contains(body, "Redis did not answer") {
		t.Errorf("overview with Redis down: %d %s; want 502 without the address", status, body)
	}
}

// TestDashboardNamesTheClusterClient: given a plain client on one node of a
// Redis Cluster, which would see that node's keys only, the pages answer
// 502 with an error that names redis.NewClusterClient (and no address). On
// one server a plain client is what it takes.
func TestDashboardNamesTheClusterClient(t *testing.T) {
	tg := redistest.New(t)
	cluster, ok := tg.Client.(*redis.ClusterClient)
	plain := tg.Client
	if ok {
		seed := cluster.Options().Addrs[0]
		c := redis.NewClient(&redis.Options{Addr: seed})
		t.Cleanup(func() { _ = c.Close() })
		plain = c
	}
	h, err := dashboard.New(plain, dashboard.WithPrefix(tg.Prefix), dashboard.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	s := &site{srv: httptestServer(t, h)}
	status, body := s.get(t, "/api/overview")
	if ok {
		if status != http.StatusBadGateway || !strings.Contains(body, "redis.NewClusterClient") || strings.Contains(body, cluster.Options().Addrs[0]) {
			t.Errorf("overview through a plain client on a Cluster node: %d %s; want 502 naming redis.NewClusterClient, without the address", status, body)
		}
	} else if status != http.StatusOK {
		t.Errorf("overview through a plain client on one server: %d %s", status, body)
	}
}

// TestDashboardRefusesHashedKeys: a key stored by its hash cannot be
// acted on: the dashboard does not have the caller key.
func TestDashboardRefusesHashedKeys(t *testing.T) {
	s := newSite(t, dashboard.WithActions(token))
	hashed := "%#" + strings.Repeat("ab", 32)
	status, body := s.post(t, action("action", "reset", "name", "partner-api", "key", hashed), nil)
	if status != http.StatusBadRequest || !strings.Contains(body, "hash") {
		t.Errorf("reset of a hashed key: %d %s; want 400", status, body)
	}
}
