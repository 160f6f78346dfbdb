package throttle_test

import (
	"context"
	"sync"
	"testing"
	"time"

	workergate "github.com/jobthrottle/jobthrottle/internal/gate"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// otherClient hides that a client is a *redis.Client, as a Cluster's or a
// wrapped one would: claims under several meters then go one call a meter.
type otherClient struct{ redis.UniversalClient }

// TestClaimAllIsAllOrNothing: a start claimed under two meters (20/s
// overall, 10/s for a tenant) takes both at one slot; a second start of the
// same tenant right after finds the overall meter's next start (50 ms
// later) but no room for the tenant then: it is refused with the tenant's
// soonest room (100 ms), and the overall meter keeps nothing of it, so its
// next start is still 50 ms after the first. The same in one round trip
// (one Redis server) and in a call per meter (any other client).
func TestClaimAllIsAllOrNothing(t *testing.T) {
	for _, together := range []bool{true, false} {
		name := map[bool]string{true: "one call", false: "a call per meter"}[together]
		t.Run(name, func(t *testing.T) {
			tg := redistest.Embedded(t)
			clock := tg.Clock(t)
			calls := &commandCounter{count: map[string]int{}}
			single := redis.NewClient(&redis.Options{Addr: tg.Mini.Addr()})
			single.AddHook(calls)
			t.Cleanup(func() { single.Close() })
			var client redis.UniversalClient = single
			if !together {
				client = otherClient{single}
			}
			meter := func(rate int) *throttle.Limiter {
				l, err := throttle.New(client, "l", throttle.GCRA{Rate: throttle.PerSecond(rate), Burst: 1}, throttle.WithPrefix(tg.Prefix))
				if err != nil {
					t.Fatal(err)
				}
				return l
			}
			overall, tenant := meter(20), meter(10)
			ctx := context.Background()
			claim := func(parts ...workergate.ClaimPart) []workergate.Claim {
				t.Helper()
				claimed, err := workergate.ClaimAll(ctx, parts, nil)
				if err != nil {
					t.Fatal(err)
				}
				return claimed.Claims
			}
			fresh := func(l *throttle.Limiter, key string) workergate.ClaimPart {
				return workergate.ClaimPart{Limiter: l, Req: workergate.ClaimRequest{Key: key, N: 1, MaxWait: time.Second}}
			}
			now := clock.Now()
			first := claim(fresh(overall, "all"), fresh(tenant, "acme"))
			if len(first) != 2 || first[0].Status != workergate.Taken || first[1].Status != workergate.Taken || !first[1].Slot.Equal(first[0].Slot) || !first[0].Slot.Equal(now) {
				t.Fatalf("first start: %+v; want both meters taken now, at one slot", first)
			}
			before := calls.total()
			second := claim(fresh(overall, "all"), fresh(tenant, "acme"))
			if want := map[bool]int{true: 1, false: 3}[together]; calls.total()-before != want {
				t.Errorf("the refused start took %d round trips, want %d", calls.total()-before, want)
			}
			if len(second) != 2 || second[0].Status != workergate.Taken || second[1].Status != workergate.NoCapacity ||
				!second[1].Slot.Equal(now.Add(100*time.Millisecond)) {
				t.Fatalf("second start of the tenant: %+v; want the overall start taken, then the tenant refused till %s", second, now.Add(100*time.Millisecond))
			}
			other := claim(fresh(overall, "all"), fresh(tenant, "bolt"))
			if len(other) != 2 || other[0].Status != workergate.Taken || !other[0].Slot.Equal(now.Add(50*time.Millisecond)) {
				t.Fatalf("another tenant's start: %+v; want the overall meter's next start, 50ms after the first (nothing kept of the refused one)", other)
			}
		})
	}
}

// TestClaimAllEntersTheRoom: a task refused by a room's meter enters the
// room in the same call, with its flow and payload, and a release lets it
// out; one admitted does not enter. The same in one round trip and in a
// call per meter.
func TestClaimAllEntersTheRoom(t *testing.T) {
	for _, together := range []bool{true, false} {
		name := map[bool]string{true: "one call", false: "a call per meter"}[together]
		t.Run(name, func(t *testing.T) {
			tg := redistest.Embedded(t)
			clock := tg.Clock(t)
			client := tg.Client
			if !together {
				client = otherClient{tg.Client}
			}
			overall, err := throttle.New(client, "overall", throttle.GCRA{Rate: throttle.PerSecond(20), Burst: 1}, throttle.WithPrefix(tg.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			claim := func(waiter string) workergate.Claimed {
				t.Helper()
				part := workergate.ClaimPart{Limiter: overall, Req: workergate.ClaimRequest{Key: "all", N: 1, Held: workergate.HeldByRoom, Ticket: waiter}}
				got, err := workergate.ClaimAll(ctx, []workergate.ClaimPart{part}, &workergate.Entry{Flow: "acme", Weight: 1, Payload: "payload of " + waiter})
				if err != nil {
					t.Fatal(err)
				}
				return got
			}
			if got := claim("w1"); got.Entered || got.Claims[0].Status != workergate.Taken {
				t.Fatalf("first: %+v; want its start taken, not entered", got)
			}
			if got := claim("w2"); !got.Entered || got.Waiters != 1 || got.Claims[0].Status != workergate.NoCapacity || got.Lease != (workergate.RoomLease{}) {
				t.Fatalf("second, with no wait allowed: %+v; want it refused and in the room, alone, nobody holding its lease", got)
			}
			rel, err := workergate.Release(ctx, overall, "all", 1, time.Second, 0, nil, workergate.Dispatcher{}, workergate.Batch{})
			if err != nil || !rel.OK || rel.Waiter != "w2" || rel.Flow != "acme" || rel.Payload != "payload of w2" {
				t.Fatalf("release: %+v, %v; want w2 of flow acme let out, with its payload", rel, err)
			}
			// A dispatcher takes the room's lease: the next to enter learns
			// who holds it and till when, so that its process need not ask.
			// (A release that leaves the room empty ends its lease: one
			// waiter stays.)
			for _, w := range []string{"w3", "w4"} {
				if got := claim(w); !got.Entered {
					t.Fatalf("%s: %+v; want it in the room", w, got)
				}
			}
			a := workergate.Dispatcher{ID: "a", Lease: 5 * time.Second}
			if rel, err := workergate.Release(ctx, overall, "all", 1, time.Second, 0, nil, a, workergate.Batch{}); err != nil || !rel.OK || rel.Waiter != "w3" {
				t.Fatalf("a's release: %+v, %v; want w3 let out", rel, err)
			}
			want := workergate.RoomLease{Holder: "a", Until: clock.Now().Add(a.Lease)}
			if got := claim("w5"); !got.Entered || got.Lease.Holder != want.Holder || !got.Lease.Until.Equal(want.Until) {
				t.Fatalf("fifth, after a's release: %+v; want it in the room, told of %+v", got, want)
			}
		})
	}
}

// TestPreparedReleaseBooksAndMoves: a release of the waiter it was
// prepared for books the waiter's slot on its other meter (claimed later
// by its ticket, at that slot) and moves its task from asynq's retry set to
// the head of its queue, in the same call; one whose other meter has no
// room at the slot (blocked) lets nobody out, and the waiter waits again,
// its flow held back.
func TestPreparedReleaseBooksAndMoves(t *testing.T) {
	tg := redistest.Embedded(t)
	tg.Clock(t)
	ctx := context.Background()
	meter := func(rate int) *throttle.Limiter {
		return newLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(rate), Burst: 1})
	}
	overall, tenant := meter(20), meter(10)
	retry, scheduled, pending, task := tg.Prefix+"retry", tg.Prefix+"scheduled", tg.Prefix+"pending", tg.Prefix+"t:task1"
	tg.Client.ZAdd(ctx, retry, redis.Z{Score: 1, Member: "task1"})
	tg.Client.HSet(ctx, task, "state", "retry")
	for _, w := range []string{"w1", "w2"} {
		if _, _, err := workergate.EnterRoom(ctx, overall, "all", w, "acme", 1, 1, 0, "payload of "+w); err != nil {
			t.Fatal(err)
		}
	}
	prep := &workergate.Prepared{Waiter: "w1", TaskID: "task1", TaskKeys: []string{retry, scheduled, pending, task}, Grace: time.Minute,
		Along: []workergate.AlongPart{{Limiter: tenant, Key: "acme", N: 1}}}
	rel, err := workergate.Release(ctx, overall, "all", 1, time.Second, 0, nil, workergate.Dispatcher{}, workergate.Batch{Prepared: []*workergate.Prepared{prep}})
	if err != nil || !rel.OK || rel.Waiter != "w1" || !rel.Booked || rel.Moved != 1 {
		t.Fatalf("release prepared for w1: %+v, %v; want w1 let out, booked and moved", rel, err)
	}
	if len(rel.Next) != 1 || rel.Next[0].ID != "w2" || rel.Next[0].Payload != "payload of w2" {
		t.Errorf("next in order after: %+v; want w2 and its payload", rel.Next)
	}
	if head, _ := tg.Client.LIndex(ctx, pending, -1).Result(); head != "task1" {
		t.Errorf("the queue's head: %q; want task1", head)
	}
	if state, _ := tg.Client.HGet(ctx, task, "state").Result(); state != "pending" {
		t.Errorf("task1's state: %q; want pending", state)
	}
	got, err := workergate.ClaimAll(ctx, []workergate.ClaimPart{{Limiter: tenant, Req: workergate.ClaimRequest{
		Key: "acme", N: 1, Held: workergate.HeldByTicket, Ticket: "w1", At: rel.Slot, Grace: time.Minute}}}, nil)
	if err != nil || got.Claims[0].Status != workergate.Admitted || !got.Claims[0].Slot.Equal(rel.Slot) {
		t.Fatalf("w1's claim on its tenant meter: %+v, %v; want its booking, at %s", got, err, rel.Slot)
	}

	// The tenant meter is blocked for a minute: no room at w2's slot.
	if err := tenant.BlockFor(ctx, "acme", time.Minute); err != nil {
		t.Fatal(err)
	}
	prep = &workergate.Prepared{Waiter: "w2", TaskID: "task2", TaskKeys: []string{retry, scheduled, pending, tg.Prefix + "t:task2"}, Grace: time.Minute,
		Along: []workergate.AlongPart{{Limiter: tenant, Key: "acme", N: 1}}}
	rel, err = workergate.Release(ctx, overall, "all", 1, time.Second, 0, nil, workergate.Dispatcher{}, workergate.Batch{Prepared: []*workergate.Prepared{prep}})
	if err != nil || rel.OK {
		t.Fatalf("release prepared for w2: %+v, %v; want nobody let out", rel, err)
	}
	rel, err = workergate.Release(ctx, overall, "all", 1, time.Second, 0, nil, workergate.Dispatcher{}, workergate.Batch{})
	if err != nil || rel.OK || rel.Due.IsZero() {
		t.Fatalf("right after: %+v, %v; want w2 waiting still, its flow held back", rel, err)
	}
	if n, _ := tg.Client.LLen(ctx, pending).Result(); n != 1 {
		t.Errorf("the queue holds %d tasks; want task1 alone (w2's task not moved)", n)
	}
}

// TestPreparedBatch: one release lets out two waiters it was prepared for,
// each booked on its own tenant's meter and its task moved to the head of
// the queue, the earlier slot's task taken first.
func TestPreparedBatch(t *testing.T) {
	tg := redistest.Embedded(t)
	tg.Clock(t)
	ctx := context.Background()
	meter := func(rate int) *throttle.Limiter {
		return newLimiter(t, tg, throttle.GCRA{Rate: throttle.PerSecond(rate), Burst: 1})
	}
	overall, tenant := meter(20), meter(10)
	retry, scheduled, pending := tg.Prefix+"retry", tg.Prefix+"scheduled", tg.Prefix+"pending"
	var prepared []*workergate.Prepared
	for i, w := range []string{"w1", "w2"} {
		id := "task" + itoa(i+1)
		tg.Client.ZAdd(ctx, retry, redis.Z{Score: 1, Member: id})
		tg.Client.HSet(ctx, tg.Prefix+"t:"+id, "state", "retry")
		if _, _, err := workergate.EnterRoom(ctx, overall, "all", w, "tenant-"+w, 1, 1, 0, "payload"); err != nil {
			t.Fatal(err)
		}
		prepared = append(prepared, &workergate.Prepared{Waiter: w, TaskID: id, TaskKeys: []string{retry, scheduled, pending, tg.Prefix + "t:" + id},
			Grace: time.Minute, Along: []workergate.AlongPart{{Limiter: tenant, Key: "tenant-" + w, N: 1}}})
	}
	rel, err := workergate.Release(ctx, overall, "all", 1, 100*time.Millisecond, 0, nil, workergate.Dispatcher{},
		workergate.Batch{Prepared: prepared, Window: 100 * time.Millisecond, Most: 2})
	if err != nil || !rel.OK || len(rel.More) != 1 {
		t.Fatalf("a prepared batch of 2: %+v, %v; want two let out", rel, err)
	}
	for _, r := range []workergate.Released{rel, rel.More[0]} {
		if !r.Booked || r.Moved != 1 {
			t.Errorf("%s: booked %v, moved %d; want booked and moved", r.Waiter, r.Booked, r.Moved)
		}
	}
	// Workers take from the right: the earliest slot's task goes first.
	if tasks, _ := tg.Client.LRange(ctx, pending, 0, -1).Result(); len(tasks) != 2 || tasks[1] != "task1" {
		t.Errorf("the queue holds %v, the head last; want both tasks, task1 (w1's, the earlier slot) at the head", tasks)
	}
}

// clockStep moves a driven clock on before every script call: time passes
// between the calls of a claim made a call per meter, as between Cluster
// nodes. The limiters' background writes (the registry of names) run on
// other goroutines: the clock, not safe for concurrent use, is guarded.
type clockStep struct {
	mu    *sync.Mutex
	clock *redistest.Clock
	step  time.Duration
}

func (c clockStep) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c clockStep) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			c.mu.Lock()
			c.clock.Advance(c.step)
			c.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}
func (c clockStep) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestClaimInTurnAtAPassedInstant: a start claimed a call per meter (on a
// Cluster, rules keyed by values in different slots) claims the second
// meter at the first's slot, which has passed when that call runs. With
// room on both meters the task is admitted on both at that slot. (Before:
// the second meter found no block and refused it, as if blocked, so every
// such task on a Cluster went to the waiting room: 9 round trips instead
// of 2.) A block on the second meter still refuses it.
func TestClaimInTurnAtAPassedInstant(t *testing.T) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	single := redis.NewClient(&redis.Options{Addr: tg.Mini.Addr()})
	t.Cleanup(func() { single.Close() })
	single.AddHook(clockStep{&sync.Mutex{}, clock, 300 * time.Microsecond})
	client := otherClient{single}
	meter := func(name string) *throttle.Limiter {
		l, err := throttle.New(client, name, throttle.GCRA{Rate: throttle.PerSecond(1000), Burst: 100}, throttle.WithPrefix(tg.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	overall, tenant := meter("overall"), meter("tenant")
	ctx := context.Background()
	parts := []workergate.ClaimPart{
		{Limiter: tenant, Req: workergate.ClaimRequest{Key: "acme", N: 1, MaxWait: time.Second}},
		{Limiter: overall, Req: workergate.ClaimRequest{Key: "all", N: 1, MaxWait: time.Second}},
	}
	for i := range 3 {
		claimed, err := workergate.ClaimAll(ctx, parts, nil)
		if err != nil {
			t.Fatal(err)
		}
		c := claimed.Claims
		if len(c) != 2 || c[0].Status != workergate.Taken || c[1].Status != workergate.Taken || !c[1].Slot.Equal(c[0].Slot) {
			t.Fatalf("start %d: %+v; want both meters taken at one slot", i, c)
		}
	}
	if err := overall.BlockFor(ctx, "all", time.Second); err != nil {
		t.Fatal(err)
	}
	claimed, err := workergate.ClaimAll(ctx, parts, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c := claimed.Claims; len(c) != 2 || c[1].Status != workergate.NoCapacity {
		t.Fatalf("a start with the overall key blocked: %+v; want it refused by the overall meter", c)
	}
}
