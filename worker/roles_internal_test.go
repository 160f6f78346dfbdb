package worker

import (
	"fmt"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// TestMeterRolesGiveTheRoomToTheFairRule: a task's waiting room is its
// FairBy rule's, whatever the order of its rules and whatever else is live
// (a live rule takes the room only when no rule is fair); with neither, the
// second meter's (typically the overall rule); a lone meter that is neither
// books ahead (leadMeter) and needs no room. Before, the first rule that
// was fair or named (today: live) took it, so a named per-tenant rule listed
// before a fair overall rule switched fair sharing off.
func TestMeterRolesGiveTheRoomToTheFairRule(t *testing.T) {
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { client.Close() })
	limiter := func(name string, opts ...throttle.Option) *throttle.Limiter {
		l, err := throttle.New(client, name, throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	conc, err := throttle.NewConcurrencyLimiter(client, "cap", throttle.Concurrency{Limit: 1, Lease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	byTenant := KeyBy(ByPayloadField("tenant"))
	plain := func(name string) Rule { return Rate(name, AnyTask(), limiter(name), byTenant) }
	live := func(name string) Rule {
		return Rate(name, AnyTask(), limiter(name, throttle.WithLivePolicies()), byTenant)
	}
	fair := func(name string) Rule {
		return Rate(name, AnyTask(), limiter(name), KeyBy(Constant("all")), FairBy(ByPayloadField("tenant")))
	}
	capRule := Concurrency("cap", AnyTask(), conc, KeyBy(Constant("all")))
	for _, c := range []struct {
		name  string
		rules []Rule
		want  []int
	}{
		{"fair alone", []Rule{fair("o")}, []int{roomMeter}},
		{"plain alone", []Rule{plain("t")}, []int{leadMeter}},
		{"live alone", []Rule{live("t")}, []int{roomMeter}},
		{"plain, then fair", []Rule{plain("t"), fair("o")}, []int{alongMeter, roomMeter}},
		{"fair, then plain", []Rule{fair("o"), plain("t")}, []int{roomMeter, alongMeter}},
		{"live, then fair", []Rule{live("t"), fair("o")}, []int{alongMeter, roomMeter}},
		{"fair, then live", []Rule{fair("o"), live("t")}, []int{roomMeter, alongMeter}},
		{"plain, then live", []Rule{plain("t"), live("o")}, []int{alongMeter, roomMeter}},
		{"live, then plain", []Rule{live("t"), plain("o")}, []int{roomMeter, alongMeter}},
		{"plain, then plain", []Rule{plain("t"), plain("o")}, []int{alongMeter, roomMeter}},
		{"cap, live, plain, fair", []Rule{capRule, live("t"), plain("u"), fair("o")}, []int{0, alongMeter, alongMeter, roomMeter}},
	} {
		rules := make([]*Rule, len(c.rules))
		for i := range c.rules {
			rules[i] = &c.rules[i]
		}
		if got := meterRoles(rules); fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("%s: roles %v, want %v (lead %d, room %d, along %d)", c.name, got, c.want, leadMeter, roomMeter, alongMeter)
		}
	}
}
