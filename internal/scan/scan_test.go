package scan_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/internal/scan"
	"github.com/redis/go-redis/v9"
)

func TestGlobEscape(t *testing.T) {
	for in, want := range map[string]string{
		"throttle:":   "throttle:",
		"a*b?c[d]e\\": `a\*b\?c\[d\]e\\`,
		"":            "",
	} {
		if got := scan.GlobEscape(in); got != want {
			t.Errorf("GlobEscape(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestPrefixFindsEveryKeyOnce writes more keys than one SCAN call looks
// at, on every master of a Cluster when the target is one, plus a key
// whose name holds the glob's characters.
func TestPrefixFindsEveryKeyOnce(t *testing.T) {
	tgt := redistest.New(t)
	ctx := context.Background()
	var want []string
	for i := range 2500 {
		k := tgt.Prefix + "k:{" + string(rune('a'+i%26)) + "}" + time.Duration(i).String()
		want = append(want, k)
	}
	want = append(want, tgt.Prefix+"odd*[x]?\\")
	for _, k := range want {
		if err := tgt.Client.Set(ctx, k, "1", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	got, err := scan.Prefix(ctx, tgt.Client, tgt.Prefix, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("found %d keys, want %d", len(got), len(want))
	}
	odd, err := scan.Match(ctx, tgt.Client, scan.GlobEscape(tgt.Prefix+"odd*[x]?\\"), tgt.Prefix, 5*time.Second)
	if err != nil || len(odd) != 1 {
		t.Fatalf("Match of the escaped key = %q, %v; want it alone", odd, err)
	}
}

// TestPrefixReturnsWithinItsBound: with a Redis that accepts connections
// but never answers, and a client on go-redis's defaults (3 s reads,
// retried), each SCAN call returns when perCall ends; a Cluster client
// whose nodes hang returns when ctx ends.
func TestPrefixReturnsWithinItsBound(t *testing.T) {
	_, proxy, client := redistest.Hangable(t)
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{proxy.Addr()}})
	t.Cleanup(func() { cluster.Close() })
	proxy.Pause()
	const bound, allowance = 200 * time.Millisecond, 150 * time.Millisecond
	start := time.Now()
	_, err := scan.Prefix(context.Background(), client, "throttle:", bound)
	if took := time.Since(start); err == nil || took > bound+allowance {
		t.Errorf("Prefix on a hung Redis: %v after %s; want an error within %s", err, took.Round(time.Millisecond), bound)
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	start = time.Now()
	_, err = scan.Prefix(ctx, cluster, "throttle:", time.Hour)
	if took := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || took > bound+allowance {
		t.Errorf("Prefix on a hung Cluster: %v after %s; want DeadlineExceeded within %s", err, took.Round(time.Millisecond), bound)
	}
}

// TestPrefixRefusesAClusterNode: a plain client on a node of a Redis
// Cluster would see that node's keys only: Prefix refuses it with
// ErrClusterNode, which names the fix. A plain client on one server (or
// miniredis) scans as usual.
func TestPrefixRefusesAClusterNode(t *testing.T) {
	tg := redistest.New(t)
	var plain *redis.Client
	switch c := tg.Client.(type) {
	case *redis.ClusterClient:
		plain = redis.NewClient(&redis.Options{Addr: c.Options().Addrs[0]})
		t.Cleanup(func() { _ = plain.Close() })
	case *redis.Client:
		plain = c
	}
	_, err := scan.Prefix(context.Background(), plain, tg.Prefix, time.Second)
	if _, cluster := tg.Client.(*redis.ClusterClient); cluster {
		if !errors.Is(err, scan.ErrClusterNode) {
			t.Fatalf("a plain client on a Cluster node: %v; want ErrClusterNode", err)
		}
		t.Logf("figures: %v", err)
	} else if err != nil {
		t.Fatalf("a plain client on one server: %v", err)
	}
}
