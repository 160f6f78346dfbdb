package redisclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestFailedOver(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{refused, true},
		{fmt.Errorf("wrapped: %w", refused), true},
		{io.EOF, true},
		{context.DeadlineExceeded, true},
		{redis.ErrPoolTimeout, true},
		{answer("MOVED 866 127.0.0.1:7001"), true},
		{answer("ASK 866 127.0.0.1:7001"), true},
		{answer("CLUSTERDOWN The cluster is down"), true},
		{answer("TRYAGAIN Multiple keys request during rehashing of slot"), true},
		{answer("READONLY You can't write against a read only replica."), true},
		{answer("LOADING Redis is loading the dataset in memory"), true},
		{redis.Nil, false},
		{context.Canceled, false},
		{redis.ErrClosed, false},
		{answer("NOSCRIPT No matching script"), false},
		{answer("WRONGTYPE Operation against a key holding the wrong kind of value"), false},
		{answer("NOPERM this user has no permissions"), false},
		{errors.New("something else"), false},
	} {
		if got := failedOver(c.err); got != c.want {
			t.Errorf("failedOver(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// TestFollowFailoversReloadsOncePerInterval: a Cluster client whose node is
// down asks for its slot map again when a command fails; failures ask once
// per ReloadEvery however many there are; a client followed twice is
// hooked once.
func TestFollowFailoversReloadsOncePerInterval(t *testing.T) {
	redistest.QuietRedisLog()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	var loads atomic.Int64
	client := redis.NewClusterClient(&redis.ClusterOptions{
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
			loads.Add(1)
			return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: []redis.ClusterNode{{Addr: dead}}}}, nil
		},
		MaxRetries: -1,
	})
	t.Cleanup(func() { client.Close() })
	FollowFailovers(client)
	FollowFailovers(client)
	waitFor := func(want int64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for loads.Load() < want {
			if time.Now().After(deadline) {
				t.Fatalf("%d loads of the slot map, want %d", loads.Load(), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// The first command loads the map; its failure asks for a reload (one:
	// the client is hooked once).
	if err := client.Get(context.Background(), "k").Err(); err == nil {
		t.Fatal("a GET to a dead node succeeded")
	}
	waitFor(2)
	time.Sleep(300 * time.Millisecond) // go-redis's own cool-down after a reload
	if n := loads.Load(); n != 2 {
		t.Fatalf("%d loads after one failed command, want 2 (the client hooked once)", n)
	}

	// Many failures within an interval ask once.
	r, _ := followed.Load(client)
	hook := r.(*reloader)
	time.Sleep(ReloadEvery)
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}
	start := time.Now()
	for range 1000 {
		hook.failed(refused)
	}
	if time.Since(start) >= ReloadEvery {
		t.Fatalf("1000 failures took %s, longer than ReloadEvery (%s): the test proves nothing", time.Since(start), ReloadEvery)
	}
	waitFor(3)
	time.Sleep(300 * time.Millisecond)
	if n := loads.Load(); n != 3 {
		t.Fatalf("%d loads after 1000 failures within %s, want 3", n, ReloadEvery)
	}
	// A failed pipeline asks too, once the interval has passed.
	time.Sleep(ReloadEvery)
	ctx := context.Background()
	if _, err := client.Pipelined(ctx, func(p redis.Pipeliner) error { p.Get(ctx, "k"); return nil }); err == nil {
		t.Fatal("a pipeline to a dead node succeeded")
	}
	waitFor(4)
}

// TestSlotsWithinMovesOnFromAHungNode: a node that accepts the connection
// and never answers (a frozen master) fails a CLUSTER SLOTS after
// SlotsWithin, not after the client's read timeout and retries; a node
// that answers is unaffected.
func TestSlotsWithinMovesOnFromAHungNode(t *testing.T) {
	redistest.QuietRedisLog()
	hung := redis.NewClient(&redis.Options{Addr: redistest.SilentAddr(t), ReadTimeout: 10 * time.Second})
	t.Cleanup(func() { hung.Close() })
	hung.AddHook(slotsWithin{})
	start := time.Now()
	err := clusterSlots(hung).Err()
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) || took > SlotsWithin+500*time.Millisecond {
		t.Fatalf("CLUSTER SLOTS on a hung node: %v after %s; want a deadline after %s", err, took, SlotsWithin)
	}
	// A server that answers: its answer comes through as it is, and other
	// commands pass.
	m := miniredis.RunT(t)
	ok := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { ok.Close() })
	ok.AddHook(slotsWithin{})
	if slots, err := clusterSlots(ok).Result(); err != nil || len(slots) == 0 {
		t.Fatalf("CLUSTER SLOTS on miniredis: %v, %v; want its slots", slots, err)
	}
	if err := ok.Set(context.Background(), "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
}

// clusterSlots sends CLUSTER SLOTS as go-redis's reload of a Cluster's map
// does (its ClusterSlots method, deprecated for applications).
func clusterSlots(c *redis.Client) *redis.ClusterSlotsCmd {
	ctx := context.Background()
	cmd := redis.NewClusterSlotsCmd(ctx, "cluster", "slots")
	_ = c.Process(ctx, cmd)
	return cmd
}
