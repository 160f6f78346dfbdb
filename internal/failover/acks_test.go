//go:build failover

package failover

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/throttle"
)

// TestReplicaAcks: a master behind Sentinels loses its replication link
// (the replica cannot authenticate again), then the master is killed and
// the replica promoted. An
// admission the master answered without waiting is lost in the promotion:
// the key admits again. With WithReplicaAcks, the decision the replica did
// not acknowledge is not an admission (ErrNotReplicated), and one it did
// acknowledge survives the promotion.
func TestReplicaAcks(t *testing.T) {
	s := startSentinels(t)
	client := s.client(t)
	ctx := context.Background()
	policy := throttle.GCRA{Rate: throttle.PerHour(1), Burst: 1}
	plain, err := throttle.New(client, "plain", policy, throttle.WithPrefix("jt-acks:"))
	if err != nil {
		t.Fatal(err)
	}
	acked, err := throttle.New(client, "acked", policy, throttle.WithPrefix("jt-acks:"), throttle.WithReplicaAcks(1, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	allow := func(l *throttle.Limiter, key string) (throttle.Result, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return l.Allow(ctx, key)
	}
	capped, err := throttle.NewConcurrencyLimiter(client, "acked-cap", throttle.Concurrency{Limit: 2, Lease: time.Minute},
		throttle.WithPrefix("jt-acks:"), throttle.WithReplicaAcks(1, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	acquireWait := func() (*throttle.Lease, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return capped.AcquireWait(ctx, "slots")
	}
	// Acknowledged while the replica follows.
	if res, err := allow(acked, "kept"); err != nil || !res.Allowed {
		t.Fatalf("acked Allow with the replica up: %+v, %v", res, err)
	}
	slot, err := acquireWait()
	if err != nil {
		t.Fatalf("acked AcquireWait with the replica up: %v", err)
	}
	cutReplication(t, s.master, s.replica)
	// A cap's line (AcquireWait, a lease's release) waits for the replica
	// as its Acquire does.
	if lease, err := acquireWait(); !errors.Is(err, throttle.ErrNotReplicated) {
		t.Errorf("acked AcquireWait with the replica frozen: %v, %v; want ErrNotReplicated", lease, err)
	}
	if err := slot.Release(ctx); !errors.Is(err, throttle.ErrNotReplicated) {
		t.Errorf("acked Release with the replica frozen: %v; want ErrNotReplicated", err)
	}
	if res, err := allow(plain, "lost"); err != nil || !res.Allowed {
		t.Fatalf("plain Allow with the replica frozen: %+v, %v", res, err)
	}
	start := time.Now()
	res, err := allow(acked, "unacked")
	took := time.Since(start)
	if !errors.Is(err, throttle.ErrNotReplicated) || !errors.Is(err, throttle.ErrUnavailable) || res.Allowed {
		t.Fatalf("acked Allow with the replica frozen: %+v, %v; want ErrNotReplicated", res, err)
	}
	s.master.kill()
	waitUntil(t, 30*time.Second, "the replica was not promoted", func() bool { return s.replica.role(t) == "master" })
	waitUntil(t, 30*time.Second, "the client did not follow the promotion", func() bool {
		_, err := allow(plain, "probe")
		return err == nil
	})
	if res, err := allow(plain, "lost"); err != nil || !res.Allowed {
		t.Errorf("the plain admission was not lost in the promotion (%+v, %v): the test did not cut replication", res, err)
	}
	// The promoted master has no replica to acknowledge: read the kept
	// key through a limiter that does not wait.
	check, err := throttle.New(client, "acked", policy, throttle.WithPrefix("jt-acks:"))
	if err != nil {
		t.Fatal(err)
	}
	if res, err := allow(check, "kept"); err != nil || res.Allowed {
		t.Errorf("the acknowledged admission was lost in the promotion: %+v, %v", res, err)
	}
	t.Logf("figures: an admission answered without WAIT, replication cut, master killed: lost (the key admitted again); "+
		"with WithReplicaAcks(1, 200ms): not acknowledged in %s, so not admitted; acknowledged ones kept", took.Round(time.Millisecond))
}

// cutReplication breaks the link from master to replica and keeps it
// broken: the replica is given a wrong password for the master (which has
// none, so the replica's AUTH fails) and its connection is killed. (A
// frozen replica does not cut it: the kernel keeps the stream for it.)
func cutReplication(t *testing.T, master, replica *node) {
	t.Helper()
	if err := replica.do(t, "CONFIG", "SET", "masterauth", "not-the-password").Err(); err != nil {
		t.Fatal(err)
	}
	if err := master.do(t, "CLIENT", "KILL", "TYPE", "replica").Err(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "the replication link did not go down", func() bool {
		info, _ := replica.do(t, "INFO", "replication").Text()
		return strings.Contains(info, "master_link_status:down")
	})
}

// BenchmarkReplicaAcks measures a decision's latency on a master with one
// replica on loopback, without and with WithReplicaAcks(1, 100ms): one
// goroutine, a new key per decision (every decision writes).
//
//	go test -tags failover -run '^$' -bench ReplicaAcks ./internal/failover/
func BenchmarkReplicaAcks(b *testing.B) {
	s := startSentinels(b)
	client := s.client(b)
	ctx := context.Background()
	policy := throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 10}
	for _, acks := range []int{0, 1} {
		name := "no-wait"
		opts := []throttle.Option{throttle.WithPrefix("jt-acks-bench:")}
		if acks > 0 {
			name = "wait-1-replica"
			opts = append(opts, throttle.WithReplicaAcks(1, 100*time.Millisecond))
		}
		lim, err := throttle.New(client, name, policy, opts...)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			keys := make([]string, b.N)
			for i := range keys {
				keys[i] = "k" + time.Now().Format("150405.000000000") + string(rune('a'+i%26))
			}
			b.ResetTimer()
			for i := range b.N {
				if _, err := lim.Allow(ctx, keys[i]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
