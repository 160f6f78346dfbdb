package main

import (
	"context"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// seed takes one unit of caller under a GCRA of 10 an hour, burst 5 (the
// unit does not come back during the test), in the database client talks
// to, and returns the prefix it used.
func seed(t *testing.T, client redis.UniversalClient, caller string) string {
	t.Helper()
	prefix := "jttest:" + strings.ReplaceAll(t.Name(), "/", ":") + ":" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
	l, err := throttle.New(client, "gcra:10/1h:5", throttle.GCRA{Rate: throttle.PerHour(10), Burst: 5}, throttle.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	take(t, l, caller, 1)
	return prefix
}

// TestThrottlectlRedisURL: a redis:// URL carries the password, the ACL
// user and the database; a wrong password is refused without showing it.
// miniredis checks AUTH as Redis does, whatever the environment names.
func TestThrottlectlRedisURL(t *testing.T) {
	t.Parallel()
	peek := []string{"peek", "--name", pol("gcra:10/1h:5"), "--policy", "gcra:10/1h:5", "tenant-1"}
	t.Run("password", func(t *testing.T) {
		// Auth is required before any connection: miniredis does not lock
		// it against the connections it serves (the limiter's background
		// write to the registry of names may be one).
		m := miniredis.RunT(t)
		m.RequireAuth("s3cret")
		prefix := seed(t, redis.NewClient(&redis.Options{Addr: m.Addr(), Password: "s3cret"}), "tenant-1")
		var got peekJSON
		r := runBinary(t, append([]string{"--json", "--redis", "redis://:s3cret@" + m.Addr(), "--prefix", prefix}, peek...)...)
		if r.code != 0 || decode(t, r, &got).Remaining != 4 {
			t.Errorf("peek with the password: %v", r)
		}
		r = runBinary(t, append([]string{"--redis", "redis://:wrong-s3cret@" + m.Addr(), "--prefix", prefix}, peek...)...)
		fails(t, r, exitFailure, "Redis at redis://:xxxxx@"+m.Addr()+" refused the connection: WRONGPASS")
		r = runBinary(t, append([]string{"--redis", m.Addr(), "--prefix", prefix}, peek...)...)
		fails(t, r, exitFailure, "refused the connection: NOAUTH")
		if strings.Contains(r.stderr, "s3cret") {
			t.Errorf("the password shows: %v", r)
		}
	})
	t.Run("ACL user and database", func(t *testing.T) {
		m := miniredis.RunT(t)
		m.RequireUserAuth("ops", "pw") // before any connection, as above
		prefix := seed(t, redis.NewClient(&redis.Options{Addr: m.Addr(), Username: "ops", Password: "pw", DB: 3}), "tenant-1")
		var got peekJSON
		r := runBinary(t, append([]string{"--json", "--redis", "redis://ops:pw@" + m.Addr() + "/3", "--prefix", prefix}, peek...)...)
		if r.code != 0 || decode(t, r, &got).Remaining != 4 {
			t.Errorf("peek in database 3: %v", r)
		}
		r = runBinary(t, append([]string{"--redis", "redis://ops:pw@" + m.Addr() + "/0", "--prefix", prefix}, peek...)...)
		full(t, r, `no state for gcra:10/1h:5@gcra key "tenant-1"`)
		r = runBinary(t, append([]string{"--redis", "redis://ops:nope@" + m.Addr() + "/3", "--prefix", prefix}, peek...)...)
		fails(t, r, exitFailure, "refused the connection")
	})
}

// TestThrottlectlRedisURLDatabase selects a database of the real server
// REDIS_ADDR names (miniredis's are tested above).
func TestThrottlectlRedisURLDatabase(t *testing.T) {
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" || os.Getenv("REDIS_CLUSTER_ADDRS") != "" {
		t.Skip("needs a Redis server at REDIS_ADDR")
	}
	t.Parallel()
	client := redis.NewClient(&redis.Options{Addr: addr, DB: 2})
	prefix := seed(t, client, "tenant-1")
	t.Cleanup(func() {
		defer client.Close()
		ctx := context.Background()
		iter := client.Scan(ctx, 0, prefix+"*", 100).Iterator() // the test's own keys, in its database
		for iter.Next(ctx) {
			client.Del(ctx, iter.Val())
		}
	})
	var got peekJSON
	r := runBinary(t, "--json", "--redis", "redis://"+addr+"/2", "--prefix", prefix, "peek", "--name", pol("gcra:10/1h:5"), "--policy", "gcra:10/1h:5", "tenant-1")
	if r.code != 0 || decode(t, r, &got).Remaining != 4 {
		t.Errorf("peek in database 2: %v", r)
	}
	r = runBinary(t, "--redis", "redis://"+addr+"/1", "--prefix", prefix, "peek", "--name", pol("gcra:10/1h:5"), "--policy", "gcra:10/1h:5", "tenant-1")
	full(t, r, "no state for")
}

// TestThrottlectlRedisEnv: --redis beats $REDIS_URL, which beats
// $REDIS_ADDR.
func TestThrottlectlRedisEnv(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	prefix := seed(t, redis.NewClient(&redis.Options{Addr: m.Addr(), DB: 1}), "tenant-1")
	closed := "127.0.0.1:1"
	args := []string{"--prefix", prefix, "--timeout", "2s", "peek", "--name", pol("gcra:10/1h:5"), "--policy", "gcra:10/1h:5", "tenant-1"}
	for _, tc := range []struct {
		name string
		env  []string
		flag string
		says string // on failure; "" for success
	}{
		{"REDIS_URL", []string{"REDIS_URL=redis://" + m.Addr() + "/1", "REDIS_ADDR=" + closed}, "", ""},
		{"REDIS_ADDR without REDIS_URL", []string{"REDIS_URL=", "REDIS_ADDR=" + closed}, "", "cannot reach Redis at " + closed},
		{"--redis over REDIS_URL", []string{"REDIS_URL=redis://" + closed, "REDIS_ADDR="}, "redis://" + m.Addr() + "/1", ""},
		{"--redis over a good REDIS_URL", []string{"REDIS_URL=redis://" + m.Addr() + "/1"}, closed, "cannot reach Redis at " + closed},
		{"bad REDIS_URL", []string{"REDIS_URL=redis://:pw@" + m.Addr() + "/x"}, "", `$REDIS_URL "redis://:xxxxx@` + m.Addr() + `/x": bad URL: redis: invalid database number`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := args
			if tc.flag != "" {
				a = append([]string{"--redis", tc.flag}, args...)
			}
			r := runBinaryEnv(t, tc.env, a...)
			if tc.says == "" {
				if r.code != 0 {
					t.Errorf("want success: %v", r)
				}
				return
			}
			code := exitFailure
			if strings.Contains(tc.says, "bad URL") {
				code = exitUsage
			}
			fails(t, r, code, tc.says)
		})
	}
}

// decode decodes r's output into v and returns it.
func decode[T any](t *testing.T, r result, v *T) T {
	t.Helper()
	if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
		t.Errorf("decoding %v: %v", r, err)
	}
	return *v
}

// TestThrottlectlRefusesAPlainConnectionToAClusterNode: --redis naming a
// node of a Redis Cluster, without --cluster, is a usage error that names
// the fix (a plain connection would list one node's keys only).
func TestThrottlectlRefusesAPlainConnectionToAClusterNode(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t, redistest.ServerOptions{Cluster: true})
	if srv.Kind != "redis-server" {
		t.Logf("no redis-server on this machine: a cluster node needs one (CI has it)")
		return
	}
	fails(t, runBinary(t, "--redis", srv.Addr, "top"), exitUsage, "is a node of a Redis Cluster: give --cluster")
	plain := redistest.StartServer(t, redistest.ServerOptions{})
	if r := runBinary(t, "--redis", plain.Addr, "top"); r.code != 0 {
		t.Errorf("top on a server that is not a Cluster node: %v", r)
	}
}
