package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// testRedis returns the address of REDIS_ADDR when set, else of a
// miniredis of the test's own (returned too), which the demo takes for a
// real Redis: what it leaves there can be listed after it stops.
func testRedis(t *testing.T) (string, *miniredis.Miniredis) {
	t.Helper()
	if addr := os.Getenv("REDIS_ADDR"); addr != "" {
		return addr, nil
	}
	mini := miniredis.RunT(t)
	return mini.Addr(), mini
}

// leftKeys returns the keys under the demo's patterns, on every master.
func leftKeys(ctx context.Context, rdb redis.UniversalClient, id string) ([]string, error) {
	var mu sync.Mutex
	var left []string
	err := eachMaster(ctx, rdb, func(ctx context.Context, node redis.Cmdable) error {
		for _, pattern := range keyPatterns(id) {
			iter := node.Scan(ctx, 0, pattern, 500).Iterator()
			for iter.Next(ctx) {
				mu.Lock()
				left = append(left, iter.Val())
				mu.Unlock()
			}
			if err := iter.Err(); err != nil {
				return err
			}
		}
		return nil
	})
	return left, err
}

// raceEnabled is set by race_test.go when the tests run with -race.
var raceEnabled bool

// TestDemoLeavesNoKeys runs the demo on a Redis it does not own, watches
// it with the throttlectl command it prints while it runs, and checks that
// once it has exited SCAN finds none of its keys: neither jobthrottle's nor
// asynq's, its per-day stats included, which the test sees appear first.
func TestDemoLeavesNoKeys(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is not on the PATH go test gives: %v", err)
	}
	throttlectl := filepath.Join(t.TempDir(), "throttlectl")
	build := []string{"build", "-o", throttlectl}
	if raceEnabled {
		// with the test's own flags, the packages are built already: a
		// build without them compiled every dependency again (the
		// package's tests took 92-103 s with a cold build cache, 25 s
		// with a warm one)
		build = append(build, "-race")
	}
	if out, err := exec.Command(goTool, append(build, "github.com/jobthrottle/jobthrottle/cmd/throttlectl")...).CombinedOutput(); err != nil {
		t.Fatalf("building throttlectl: %v\n%s", err, out)
	}
	addr, mini := testRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	ctx := context.Background()

	// The demo runs with its stdout on a pipe the test reads as it goes.
	args := []string{"--duration", "30s", "--tasks", "160", "--batch", "10", "--exports", "2", "--redis", addr}
	outR, outW := io.Pipe()
	var errs bytes.Buffer
	exit := make(chan int, 1)
	go func() {
		code := run(ctx, args, outW, &errs, noEnv)
		outW.Close()
		exit <- code
	}()
	lines := bufio.NewReader(outR)
	var intro strings.Builder
	for !watchLine.MatchString(intro.String()) {
		line, err := lines.ReadString('\n')
		intro.WriteString(line)
		if err != nil {
			t.Fatalf("the demo printed no throttlectl command before %v:\n%s", err, intro.String())
		}
	}
	var rest bytes.Buffer
	drained := make(chan struct{})
	go func() { _, _ = io.Copy(&rest, lines); close(drained) }()
	id, watch := introduced(t, intro.String())

	// The printed command works while the demo runs, and finds its keys.
	words := strings.Fields(watch)
	if !slices.Equal(words[:3], []string{"go", "run", "./cmd/throttlectl"}) {
		t.Fatalf("watch command %q does not run ./cmd/throttlectl", watch)
	}
	// The demo prints the command before its first task has run, so its
	// keys may not exist yet: --all is asked again until it lists one.
	listed := regexp.MustCompile(`(?m)^(acme|globex|initech|partner-api|exports)\s`)
	for _, extra := range [][]string{nil, {"--all"}} {
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			cmd := exec.Command(throttlectl, append(words[3:], extra...)...)
			// (a -race binary sleeps a second as it exits, unless told not to)
			cmd.Env = append(os.Environ(), "REDIS_ADDR=", "REDIS_URL=", "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Errorf("%s %v: %v\n%s", watch, extra, err, out)
				break
			}
			if extra == nil || listed.Match(out) {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s --all lists none of the demo's keys within 15 s:\n%s", watch, out)
				break
			}
		}
	}

	// asynq's per-day stats appear under the patterns the demo deletes.
	perDay := "asynq:{" + demoQueue(id) + "}:processed:*"
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		keys, _, err := rdb.Scan(ctx, 0, perDay, 1000).Result()
		if err == nil && len(keys) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s key within 10 s (%v)", perDay, err)
		}
	}

	code := <-exit
	<-drained
	out := intro.String() + rest.String()
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errs.String())
	}
	if !regexp.MustCompile(`(?m)^Removed the demo's [1-9]\d* keys from the Redis at ` + regexp.QuoteMeta(addr) + `\.$`).MatchString(out) {
		t.Errorf("no count of the keys removed:\n%s", out)
	}
	assertNoKeysOf(t, rdb, id)
	if mini != nil {
		if keys := mini.Keys(); len(keys) > 0 {
			t.Errorf("keys left in a Redis that had none before the demo: %q", keys)
		}
	}
}

// assertNoKeysOf fails t when Redis holds a key of the demo with id, or
// an entry of it in asynq's shared sets.
func assertNoKeysOf(t *testing.T, rdb redis.UniversalClient, id string) {
	t.Helper()
	ctx := context.Background()
	left, err := leftKeys(ctx, rdb, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Errorf("%d keys left under %q: %q", len(left), keyPatterns(id), left)
	}
	if ok, err := rdb.SIsMember(ctx, asynqQueues, demoQueue(id)).Result(); err != nil || ok {
		t.Errorf("%s still lists the queue %s (%v)", asynqQueues, demoQueue(id), err)
	}
	servers, err := asynq.NewInspectorFromRedisClient(rdb).Servers()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range servers {
		if _, ours := s.Queues[demoQueue(id)]; ours {
			t.Errorf("asynq still lists the demo's server %s:%d:%s", s.Host, s.PID, s.ID)
		}
	}
}

// TestRemoveKeysTakesOnlyTheDemos seeds every kind of key the demo can
// leave, beside another demo's, and checks that removeKeys deletes all of
// its own and nothing else.
func TestRemoveKeysTakesOnlyTheDemos(t *testing.T) {
	addr, _ := testRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	ctx := context.Background()
	ours, theirs := newTestID(t), newTestID(t)
	keysOf := func(id string) []string {
		q := "asynq:{" + demoQueue(id) + "}"
		return []string{
			demoPrefix(id) + "{gcra:10/1s:1}:acme", demoPrefix(id) + "{conc:2/10s}:exports", demoPrefix(id) + "room:{x}",
			q + ":pending", q + ":t:0123", q + ":lease", q + ":completed",
			q + ":processed", q + ":failed", // asynq's totals, kept forever
			q + ":processed:2026-01-31", q + ":failed:2026-01-31", // its per-day stats, kept 90 days
			q + ":processed:" + time.Now().UTC().Format("2006-01-02"),
		}
	}
	for _, id := range []string{ours, theirs} {
		for _, key := range keysOf(id) {
			if err := rdb.Set(ctx, key, "x", time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if err := rdb.SAdd(ctx, asynqQueues, demoQueue(id)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		rdb.Del(ctx, keysOf(theirs)...)
		rdb.SRem(ctx, asynqQueues, demoQueue(theirs))
	})

	d := &demo{id: ours, queue: demoQueue(ours), prefix: demoPrefix(ours), rdb: rdb, inspector: asynq.NewInspectorFromRedisClient(rdb)}
	removed, err := d.removeKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := len(keysOf(ours)); removed != want {
		t.Errorf("removed %d keys, want %d", removed, want)
	}
	assertNoKeysOf(t, rdb, ours)
	for _, key := range keysOf(theirs) {
		if n, err := rdb.Exists(ctx, key).Result(); err != nil || n != 1 {
			t.Errorf("another demo's %s is gone (%v)", key, err)
		}
	}
	if ok, _ := rdb.SIsMember(ctx, asynqQueues, demoQueue(theirs)).Result(); !ok {
		t.Errorf("another demo's queue left %s", asynqQueues)
	}
}

func newTestID(t *testing.T) string {
	t.Helper()
	var id [4]byte
	if _, err := rand.Read(id[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(id[:])
}
