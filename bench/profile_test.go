package main

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// TestTimedScriptsDecideAsTheScripts: with timeScripts, a limiter's
// decisions run the timed copy of its script (the profile counts them,
// under the script's name and mode) and decide as the script does: a
// GCRA of burst 2 admits two and refuses the third.
func TestTimedScriptsDecideAsTheScripts(t *testing.T) {
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		addr = miniredis.RunT(t).Addr()
	}
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	if err := rdb.Del(ctx, profileKey).Err(); err != nil {
		t.Fatal(err)
	}
	if err := timeScripts(ctx, rdb); err != nil {
		t.Fatal(err)
	}
	l, err := throttle.New(rdb, "jtbench-timed-"+time.Now().Format("150405.000000"), throttle.GCRA{Rate: throttle.PerMinute(1), Burst: 2})
	if err != nil {
		t.Fatal(err)
	}
	var allowed []bool
	for range 3 {
		r, err := l.Allow(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		allowed = append(allowed, r.Allowed)
	}
	if !allowed[0] || !allowed[1] || allowed[2] {
		t.Fatalf("allowed %v; want true, true, false", allowed)
	}
	times, err := readScriptTimes(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	got := times["meter:0"]
	if got.calls != 3 || got.us < 0 {
		t.Fatalf("profile %v; want 3 calls of meter:0", times)
	}
}

// TestTimedScriptsTakeTheWorkersToo: the worker's own scripts, read from
// ../worker/lua/assembled, have timed copies too.
func TestTimedScriptsTakeTheWorkersToo(t *testing.T) {
	text, err := os.ReadFile("../worker/lua/assembled/lane_poll.lua")
	if err != nil {
		t.Fatal(err)
	}
	timed, err := timedScripts()
	if err != nil {
		t.Fatal(err)
	}
	sum := sha1.Sum(text)
	if _, ok := timed[hex.EncodeToString(sum[:])]; !ok {
		t.Fatalf("no timed copy of lane_poll.lua among %d scripts", len(timed))
	}
}
