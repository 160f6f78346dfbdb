//go:build failover

package failover

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// node is one redis-server process (a Cluster node, a master, a replica or
// a Sentinel) of a test's own.
type node struct {
	addr string
	port int
	dir  string
	args []string
	cmd  *exec.Cmd
}

// redisServer is the binary the tests run: $REDIS_SERVER or redis-server.
func redisServer(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv("REDIS_SERVER"); bin != "" {
		return bin
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("the failover tests need redis-server on PATH (or REDIS_SERVER): %v", err)
	}
	return bin
}

// startNode starts a redis-server with args (after the port, the bind
// address and no persistence) and waits until it answers PING. It is
// killed when the test ends.
func startNode(t testing.TB, args ...string) *node {
	t.Helper()
	redistest.QuietRedisLog()
	n := &node{port: freePort(t), dir: t.TempDir()}
	n.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(n.port))
	n.args = append([]string{"--port", strconv.Itoa(n.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", n.dir}, args...)
	n.start(t)
	t.Cleanup(n.kill)
	return n
}

func (n *node) start(t testing.TB) {
	t.Helper()
	n.cmd = exec.Command(redisServer(t), n.args...)
	log, err := os.Create(filepath.Join(n.dir, fmt.Sprintf("log-%d", time.Now().UnixNano())))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	n.cmd.Stdout, n.cmd.Stderr = log, log
	if err := n.cmd.Start(); err != nil {
		t.Fatalf("starting redis-server: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: n.addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(20 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(log.Name())
			t.Fatalf("redis-server on %s does not answer:\n%s", n.addr, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill ends the process with SIGKILL: a crash.
func (n *node) kill() {
	if n.cmd != nil {
		_ = n.cmd.Process.Signal(syscall.SIGCONT) // a frozen process dies too
		_ = n.cmd.Process.Kill()
		_ = n.cmd.Wait()
		n.cmd = nil
	}
}

// freeze stops the process with SIGSTOP: it keeps its connections and
// answers nothing, as a hung machine would.
func (n *node) freeze(t testing.TB) {
	t.Helper()
	if err := n.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
}

// thaw lets a frozen process go on (SIGCONT).
func (n *node) thaw(t testing.TB) {
	t.Helper()
	if err := n.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
}

// do sends one command to the node alone, in RESP2 (whose replies are
// arrays where RESP3's are maps, as SENTINEL MASTER's).
func (n *node) do(t testing.TB, args ...any) *redis.Cmd {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: n.addr, MaxRetries: -1, Protocol: 2})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cmd := c.Do(ctx, args...)
	_ = cmd.Err()
	return cmd
}

// role returns what ROLE says the node is: "master", "slave" or "sentinel".
func (n *node) role(t testing.TB) string {
	t.Helper()
	v, err := n.do(t, "ROLE").Slice()
	if err != nil || len(v) == 0 {
		return fmt.Sprintf("unknown (%v)", err)
	}
	s, _ := v[0].(string)
	return s
}

// handedOut holds the ports freePort returned, so that tests running side
// by side never get the same one before its server listens.
var handedOut struct {
	sync.Mutex
	ports map[int]bool
}

// freePort returns a loopback port nothing listens on, nor on the port
// 10000 above it (a Cluster node's bus), and that it has not returned
// before.
func freePort(t testing.TB) int {
	t.Helper()
	handedOut.Lock()
	defer handedOut.Unlock()
	if handedOut.ports == nil {
		handedOut.ports = map[int]bool{}
	}
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if port+10000 > 65535 || handedOut.ports[port] || handedOut.ports[port+10000] {
			continue
		}
		bus, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+10000)))
		if err != nil {
			continue
		}
		bus.Close()
		handedOut.ports[port], handedOut.ports[port+10000] = true, true
		return port
	}
	t.Fatal("no free port")
	return 0
}

// waitUntil polls cond every 50 ms and fails the test after d.
func waitUntil(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// cluster is a Redis Cluster of three masters with a replica each and
// cluster-node-timeout 1000 ms.
type cluster struct {
	t                 testing.TB
	masters, replicas []*node
}

// nodeTimeout is the Cluster's cluster-node-timeout: a master that does not
// answer for this long is failed over (cluster) or taken as down (Sentinel's
// down-after-milliseconds).
const nodeTimeout = 1000 * time.Millisecond

func startCluster(t testing.TB) *cluster {
	t.Helper()
	c := &cluster{t: t}
	for i := range 6 {
		n := startNode(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", strconv.Itoa(int(nodeTimeout.Milliseconds())))
		if i < 3 {
			c.masters = append(c.masters, n)
		} else {
			c.replicas = append(c.replicas, n)
		}
	}
	ranges := [][2]int{{0, 5460}, {5461, 10922}, {10923, 16383}}
	for i, m := range c.masters {
		if err := m.do(t, "CLUSTER", "ADDSLOTSRANGE", ranges[i][0], ranges[i][1]).Err(); err != nil {
			t.Fatalf("CLUSTER ADDSLOTSRANGE: %v", err)
		}
		if err := m.do(t, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			t.Fatalf("CLUSTER SET-CONFIG-EPOCH: %v", err)
		}
	}
	all := c.all()
	for _, n := range all[1:] {
		if err := n.do(t, "CLUSTER", "MEET", "127.0.0.1", all[0].port).Err(); err != nil {
			t.Fatalf("CLUSTER MEET: %v", err)
		}
	}
	waitUntil(t, 20*time.Second, "the Cluster's nodes did not all meet", func() bool {
		for _, n := range all {
			s, _ := n.do(t, "CLUSTER", "NODES").Text()
			if strings.Count(strings.TrimSpace(s), "\n")+1 != len(all) {
				return false
			}
		}
		return true
	})
	for i, r := range c.replicas {
		id, err := c.masters[i].do(t, "CLUSTER", "MYID").Text()
		if err != nil {
			t.Fatal(err)
		}
		if err := r.do(t, "CLUSTER", "REPLICATE", id).Err(); err != nil {
			t.Fatalf("CLUSTER REPLICATE: %v", err)
		}
	}
	waitUntil(t, 30*time.Second, "the Cluster did not come up with a synced replica per master", func() bool {
		for _, n := range all {
			info, _ := n.do(t, "CLUSTER", "INFO").Text()
			if !strings.Contains(info, "cluster_state:ok") {
				return false
			}
		}
		for _, r := range c.replicas {
			info, _ := r.do(t, "INFO", "replication").Text()
			if !strings.Contains(info, "master_link_status:up") {
				return false
			}
		}
		return true
	})
	return c
}

func (c *cluster) all() []*node { return append(append([]*node(nil), c.masters...), c.replicas...) }

// seeds returns the addresses of every node, for a ClusterClient.
func (c *cluster) seeds() []string {
	var addrs []string
	for _, n := range c.all() {
		addrs = append(addrs, n.addr)
	}
	return addrs
}

// client returns a ClusterClient with go-redis's defaults on the Cluster.
func (c *cluster) client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.seeds()})
	t.Cleanup(func() { _ = client.Close() })
	return client
}

// masterOf returns the node that serves the slot of a hash tag's content
// now, as the Cluster says.
func (c *cluster) masterOf(t testing.TB, tag string) *node {
	t.Helper()
	slot, err := c.masters[0].do(t, "CLUSTER", "KEYSLOT", tag).Int()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.all() {
		if n.cmd == nil {
			continue
		}
		s, _ := n.do(t, "CLUSTER", "SLOTS").Slice()
		for _, r := range s {
			row := r.([]any)
			lo, hi := row[0].(int64), row[1].(int64)
			if int64(slot) >= lo && int64(slot) <= hi {
				port := row[2].([]any)[1].(int64)
				for _, m := range c.all() {
					if int64(m.port) == port {
						return m
					}
				}
			}
		}
		break
	}
	t.Fatalf("no node serves slot %d", slot)
	return nil
}

// sentinels is a master with one replica behind three Sentinels that fail
// it over when it does not answer for nodeTimeout.
type sentinels struct {
	master, replica *node
	sentinels       []*node
}

// masterName is the name the Sentinels know the master by.
const masterName = "jt-failover"

func startSentinels(t testing.TB) *sentinels {
	t.Helper()
	s := &sentinels{master: startNode(t)}
	s.replica = startNode(t, "--replicaof", "127.0.0.1", strconv.Itoa(s.master.port))
	waitUntil(t, 20*time.Second, "the replica did not sync", func() bool {
		info, _ := s.replica.do(t, "INFO", "replication").Text()
		return strings.Contains(info, "master_link_status:up")
	})
	for range 3 {
		dir := t.TempDir()
		conf := filepath.Join(dir, "sentinel.conf")
		body := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 2\n"+
			"sentinel down-after-milliseconds %s %d\n"+
			"sentinel failover-timeout %s 10000\n"+
			"sentinel parallel-syncs %s 1\n",
			masterName, s.master.port, masterName, nodeTimeout.Milliseconds(), masterName, masterName)
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		n := &node{port: freePort(t), dir: dir}
		n.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(n.port))
		n.args = []string{conf, "--sentinel", "--port", strconv.Itoa(n.port), "--bind", "127.0.0.1"}
		n.start(t)
		t.Cleanup(n.kill)
		s.sentinels = append(s.sentinels, n)
	}
	waitUntil(t, 20*time.Second, "the Sentinels did not find each other and the replica", func() bool {
		for _, n := range s.sentinels {
			v, err := n.do(t, "SENTINEL", "MASTER", masterName).Slice()
			if err != nil {
				return false
			}
			fields := map[string]string{}
			for i := 0; i+1 < len(v); i += 2 {
				fields[fmt.Sprint(v[i])] = fmt.Sprint(v[i+1])
			}
			if fields["num-other-sentinels"] != "2" || fields["num-slaves"] != "1" {
				return false
			}
		}
		return true
	})
	return s
}

// addrs returns the Sentinels' addresses.
func (s *sentinels) addrs() []string {
	var out []string
	for _, n := range s.sentinels {
		out = append(out, n.addr)
	}
	return out
}

// announced reports whether the replica is a master and every Sentinel
// names it as the master. Sentinel promotes the replica first and announces
// it after, so a new client can still be sent to the old master between the
// two.
func (s *sentinels) announced(t testing.TB) bool {
	t.Helper()
	if s.replica.role(t) != "master" {
		return false
	}
	for _, n := range s.sentinels {
		v, err := n.do(t, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", masterName).StringSlice()
		if err != nil || len(v) != 2 || net.JoinHostPort(v[0], v[1]) != s.replica.addr {
			return false
		}
	}
	return true
}

// client returns go-redis's Sentinel client (NewFailoverClient) with its
// defaults.
func (s *sentinels) client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: masterName, SentinelAddrs: s.addrs()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// masterAndReplica returns the master that serves the slot of a hash tag's
// content and its replica.
func (c *cluster) masterAndReplica(tag string) (master, replica *node) {
	m := c.masterOf(c.t, tag)
	for i, n := range c.masters {
		if n == m {
			return m, c.replicas[i]
		}
	}
	c.t.Fatalf("%s serves %q and is no first master", m.addr, tag)
	return nil, nil
}
