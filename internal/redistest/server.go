package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Server is a Redis of one test's own that the test stops, starts again
// and pauses: a redis-server process when the binary is on PATH (or named
// by REDIS_SERVER), else (or with REDIS_SERVER=miniredis) an embedded
// miniredis behind a [Proxy]. Either
// way its data outlives Stop and Start: redis-server's in its append-only
// file (with AOF), miniredis's in memory. Not safe for concurrent use.
type Server struct {
	// Addr is where clients connect; it stays the same across restarts.
	Addr string
	// Kind is "redis-server" or "miniredis".
	Kind string

	bin     string
	port    int
	dir     string
	aof     bool
	cluster bool // cluster mode on
	cmd     *exec.Cmd
	mini    *miniredis.Miniredis
	proxy   *Proxy
}

// ServerOptions configure [StartServer].
type ServerOptions struct {
	// AOF turns on redis-server's append-only file, synced on every write,
	// so that a crash (Stop) loses nothing.
	AOF bool
	// Cluster starts redis-server with cluster mode on: a node of a
	// Redis Cluster of its own, no slots assigned (no effect on miniredis).
	Cluster bool
}

// StartServer starts a Redis for this test and stops it when the test
// ends. It quiets go-redis's own logger (see QuietRedisLog).
func StartServer(tb testing.TB, opts ServerOptions) *Server {
	tb.Helper()
	QuietRedisLog() // the test stops and pauses it on purpose
	s := &Server{dir: tb.TempDir(), aof: opts.AOF, cluster: opts.Cluster}
	s.bin = os.Getenv("REDIS_SERVER")
	if s.bin == "" {
		s.bin, _ = exec.LookPath("redis-server")
	}
	if s.bin == "" || s.bin == "miniredis" {
		s.Kind = "miniredis"
		s.mini = miniredis.RunT(tb)
		s.proxy = NewProxy(tb, s.mini.Addr())
		s.Addr = s.proxy.Addr()
		return s
	}
	s.Kind = "redis-server"
	s.port = freePort(tb)
	s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
	s.Start(tb)
	tb.Cleanup(func() { s.kill() })
	return s
}

// Client returns a connection pool to the server, closed when the test
// ends. opts may be nil; its Addr is set.
func (s *Server) Client(tb testing.TB, opts *redis.Options) *redis.Client {
	tb.Helper()
	if opts == nil {
		opts = &redis.Options{}
	}
	o := *opts
	o.Addr = s.Addr
	c := redis.NewClient(&o)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Target returns a [Target] on the server, for the helpers that take one.
func (s *Server) Target(tb testing.TB) *Target {
	tb.Helper()
	t := &Target{Prefix: prefix(tb), Kind: s.Kind, connect: func() redis.UniversalClient {
		return redis.NewClient(&redis.Options{Addr: s.Addr})
	}}
	t.Client = t.NewClient(tb)
	return t
}

// Stop crashes the server: SIGKILL for redis-server (what the append-only
// file holds survives), Close for miniredis. Connections in use break.
func (s *Server) Stop(tb testing.TB) {
	tb.Helper()
	if s.mini != nil {
		s.mini.Close()
		s.proxy.DropConnections()
		return
	}
	s.kill()
}

func (s *Server) kill() {
	if s.cmd != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		s.cmd = nil
	}
}

// Start starts the server again on the same address with the same data,
// and waits until it answers.
func (s *Server) Start(tb testing.TB) {
	tb.Helper()
	if s.mini != nil {
		if err := s.mini.Restart(); err != nil {
			tb.Fatalf("redistest: restarting miniredis: %v", err)
		}
		return
	}
	args := []string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--save", "",
		"--dir", s.dir, "--enable-debug-command", "yes"}
	if s.aof {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		args = append(args, "--appendonly", "no")
	}
	if s.cluster {
		args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(s.dir, "nodes.conf"))
	}
	s.cmd = exec.Command(s.bin, args...)
	logFile, err := os.Create(filepath.Join(s.dir, fmt.Sprintf("redis-%d.log", time.Now().UnixNano())))
	if err != nil {
		tb.Fatal(err)
	}
	defer logFile.Close()
	s.cmd.Stdout, s.cmd.Stderr = logFile, logFile
	if err := s.cmd.Start(); err != nil {
		tb.Fatalf("redistest: starting %s: %v", s.bin, err)
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := c.Ping(context.Background()).Err()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logFile.Name())
			tb.Fatalf("redistest: redis-server on %s does not answer: %v\n%s", s.Addr, err, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Pause makes the server answer nothing for d while it keeps its
// connections: CLIENT PAUSE on redis-server, a paused [Proxy] in front of
// miniredis. It returns at once.
func (s *Server) Pause(tb testing.TB, d time.Duration) {
	tb.Helper()
	if s.mini != nil {
		s.proxy.Pause()
		time.AfterFunc(d, s.proxy.Resume)
		return
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	if err := c.Do(context.Background(), "CLIENT", "PAUSE", d.Milliseconds(), "ALL").Err(); err != nil {
		tb.Fatalf("redistest: CLIENT PAUSE: %v", err)
	}
}

// freePort returns a loopback TCP port nothing listens on now.
func freePort(tb testing.TB) int {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
