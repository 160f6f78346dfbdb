package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/dashboard"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// server is a throttlectl serve running as an operator runs it.
type server struct {
	t      *testing.T
	cmd    *exec.Cmd
	url    string // "http://127.0.0.1:PORT/"
	stderr *syncBuffer
	extra  *syncBuffer   // stdout after the URL line
	done   chan struct{} // closed when stdout ends
}

// syncBuffer is a bytes.Buffer safe for the process's writes and the
// test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// serve starts throttlectl serve on a free loopback port with the cli's
// global flags, env over the test's environment, and args after the
// command; it returns once the dashboard's URL is printed. The test's end
// stops it with SIGINT, which must end it with status 0.
func (c *cli) serve(env []string, args ...string) *server {
	c.t.Helper()
	all := append(append(append([]string{}, c.global...), "serve", "--addr", "127.0.0.1:0"), args...)
	cmd := exec.Command(binary, all...)
	cmd.Env = append(os.Environ(), env...)
	s := &server{t: c.t, cmd: cmd, stderr: &syncBuffer{}, extra: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stderr = s.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		c.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	first := make(chan string, 1)
	go func() {
		defer close(s.done)
		sc := bufio.NewScanner(stdout)
		for n := 0; sc.Scan(); n++ {
			if n == 0 {
				first <- sc.Text()
				continue
			}
			_, _ = s.extra.Write(append(sc.Bytes(), '\n'))
		}
	}()
	c.t.Cleanup(func() { s.stop() })
	select {
	case line := <-first:
		url, found := strings.CutPrefix(line, "dashboard: ")
		if !found || !strings.HasPrefix(url, "http://127.0.0.1:") || !strings.HasSuffix(url, "/") {
			c.t.Fatalf("serve printed %q, want \"dashboard: http://127.0.0.1:PORT/\"; stderr:\n%s", line, s.stderr.String())
		}
		s.url = url
	case <-time.After(30 * time.Second):
		c.t.Fatalf("serve printed no URL in 30s; stderr:\n%s", s.stderr.String())
	}
	return s
}

// stop sends SIGINT and checks that serve shuts down cleanly.
func (s *server) stop() {
	s.t.Helper()
	if s.cmd.ProcessState != nil {
		return
	}
	if err := s.cmd.Process.Signal(os.Interrupt); err != nil {
		s.t.Errorf("interrupting serve: %v", err)
	}
	exited := make(chan error, 1)
	go func() {
		<-s.done
		exited <- s.cmd.Wait()
	}()
	select {
	case err := <-exited:
		if err != nil {
			s.t.Errorf("serve on SIGINT: %v; stderr:\n%s", err, s.stderr.String())
		}
		if s.extra.String() != "" {
			s.t.Errorf("serve printed more than its URL on stdout:\n%s", s.extra.String())
		}
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		s.t.Errorf("serve did not stop within 30s of SIGINT; stderr:\n%s", s.stderr.String())
	}
}

// get fetches path under the dashboard and returns the status and body.
func (s *server) get(path string) (int, []byte) {
	s.t.Helper()
	resp, err := http.Get(s.url + strings.TrimPrefix(path, "/"))
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatal(err)
	}
	return resp.StatusCode, body
}

// action posts an action as the dashboard's page does, with token unless
// it is "".
func (s *server) action(token, body string) (int, string) {
	s.t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.url+"api/action", strings.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set(dashboard.TokenHeader, token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// overviewJSON is the part of api/overview the tests read.
type overviewJSON struct {
	Limiters []struct {
		Name string `json:"name"`
	} `json:"limiters"`
}

// overview fetches api/overview, which must be JSON.
func (s *server) overview() overviewJSON {
	s.t.Helper()
	status, body := s.get("/api/overview")
	var o overviewJSON
	if status != http.StatusOK {
		s.t.Fatalf("GET api/overview: status %d: %s", status, body)
	}
	if err := json.Unmarshal(body, &o); err != nil {
		s.t.Fatalf("GET api/overview: not JSON: %v: %s", err, body)
	}
	return o
}

// TestThrottlectlServe serves the dashboard read-only: its page and its
// JSON answer, and an action is refused.
func TestThrottlectlServe(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	take(t, c.limiter(throttle.GCRA{Rate: throttle.PerHour(1), Burst: 1}), "tenant-1", 1)
	s := c.serve(nil)
	if status, body := s.get("/"); status != http.StatusOK || !bytes.Contains(bytes.ToLower(body), []byte("<html")) {
		t.Errorf("GET /: status %d, want 200 and a page:\n%.300s", status, body)
	}
	s.overview()
	if status, body := s.action("", `{"action":"reset","name":"x","key":"y"}`); status != http.StatusForbidden {
		t.Errorf("an action without --actions: status %d, want 403: %s", status, body)
	}
	s.stop()
	if strings.Contains(s.stderr.String(), "actions token") {
		t.Errorf("a token was printed without --actions:\n%s", s.stderr.String())
	}
}

// TestThrottlectlServeActions: with --actions and $THROTTLECTL_TOKEN, a
// reset without the token is refused and one with it resets the key.
func TestThrottlectlServeActions(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	l := c.limiter(throttle.GCRA{Rate: throttle.PerHour(1), Burst: 1})
	take(t, l, "tenant-1", 1)
	const token = "0123456789abcdef-serve-test"
	s := c.serve([]string{tokenEnv + "=" + token}, "--actions")
	var name string
	for _, lim := range s.overview().Limiters {
		name = lim.Name // the only limiter under the prefix
	}
	if name == "" {
		t.Fatalf("api/overview lists no limiter")
	}
	reset, _ := json.Marshal(map[string]string{"action": "reset", "name": name, "key": "tenant-1"})
	if status, body := s.action("", string(reset)); status != http.StatusUnauthorized {
		t.Errorf("reset without the token: status %d, want 401: %s", status, body)
	}
	if r, err := l.Peek(context.Background(), "tenant-1"); err != nil || r.Allowed {
		t.Fatalf("the key was reset without the token: %+v, %v", r, err)
	}
	if status, body := s.action(token, string(reset)); status != http.StatusOK {
		t.Errorf("reset with the token: status %d, want 200: %s", status, body)
	}
	if r, err := l.Peek(context.Background(), "tenant-1"); err != nil || !r.Allowed {
		t.Errorf("the key was not reset: %+v, %v", r, err)
	}
	s.stop()
	if strings.Contains(s.stderr.String(), "actions token") {
		t.Errorf("a token was printed though $%s gives it:\n%s", tokenEnv, s.stderr.String())
	}
}

// TestThrottlectlServeGeneratedToken: without $THROTTLECTL_TOKEN, --actions
// prints a random token on stderr, once, and it works.
func TestThrottlectlServeGeneratedToken(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	s := c.serve([]string{tokenEnv + "="}, "--actions")
	// stderr is copied apart from stdout: the token, printed before the
	// URL, may arrive a moment after it.
	for deadline := time.Now().Add(10 * time.Second); s.stderr.String() == "" && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	line := strings.TrimSpace(s.stderr.String())
	i := strings.LastIndex(line, " ")
	token := line[i+1:]
	if strings.Count(line, "\n") != 0 || len(token) != 32 || strings.Trim(token, "0123456789abcdef") != "" {
		t.Fatalf("want one line on stderr ending in a 32 hex-digit token, got %q", s.stderr.String())
	}
	if status, body := s.action(token, `{"action":"reset","name":"nope","key":"x"}`); status != http.StatusNotFound {
		t.Errorf("with the printed token: status %d, want 404 (no such limiter): %s", status, body)
	}
	if status, body := s.action(token+"x", `{"action":"reset","name":"nope","key":"x"}`); status != http.StatusForbidden {
		t.Errorf("with a wrong token: status %d, want 403: %s", status, body)
	}
}

// TestThrottlectlServeConfig: --config takes top's file, concurrency caps
// included, and refuses a bad policy.
func TestThrottlectlServeConfig(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	good := writeFile(t, `{"partner-api": "gcra:10/1s:5", "exports": "conc:3/30s"}`)
	c.serve(nil, "--config", good).overview()
	bad := writeFile(t, `{"partner-api": "gcra:nonsense"}`)
	fails(t, c.run("serve", "--addr", "127.0.0.1:0", "--config", bad), exitUsage, `limiter "partner-api"`)
}

// writeFile writes content to a file of the test's and returns its path.
func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := t.TempDir() + "/config.json"
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestThrottlectlServeRefuses: usage errors and an unreachable Redis fail
// before serving.
func TestThrottlectlServeRefuses(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	for _, tc := range []struct {
		env  []string
		args []string
		code int
		says string
	}{
		{nil, []string{"--addr", "nonsense"}, exitUsage, `--addr "nonsense"`},
		{nil, []string{"--addr", "127.0.0.1:99999"}, exitUsage, `bad port "99999"`},
		{nil, []string{"--addr", "127.0.0.1:"}, exitUsage, `bad port ""`},
		{nil, []string{"extra"}, exitUsage, "takes no arguments"},
		{[]string{tokenEnv + "=short"}, []string{"--actions"}, exitUsage, "at least 16 characters"},
	} {
		r := runBinaryEnv(t, tc.env, append(append(append([]string{}, c.global...), "serve"), tc.args...)...)
		fails(t, r, tc.code, tc.says)
	}
	dead := redistest.DeadAddr(t)
	fails(t, runBinary(t, "--redis", dead, "--timeout", "2s", "serve", "--addr", "127.0.0.1:0"), exitFailure, "cannot reach Redis at "+dead)
	// A port taken: a failure at run time.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	fails(t, c.run("serve", "--addr", ln.Addr().String()), exitFailure, "serve: listen tcp")
}

// TestThrottlectlServeDefaultAddr: serve listens on loopback unless told
// otherwise, and its help says so (without binding the port here).
func TestThrottlectlServeDefaultAddr(t *testing.T) {
	t.Parallel()
	host, port, err := net.SplitHostPort(defaultServeAddr)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() || port != "8080" {
		t.Errorf("default --addr %q, want a loopback address on port 8080", defaultServeAddr)
	}
	r := runBinary(t, "serve", "--help")
	if r.code != 0 || !strings.Contains(r.stdout, `(default "127.0.0.1:8080")`) || !strings.Contains(r.stdout, "loopback") {
		t.Errorf("serve --help does not show the loopback default: %v", r)
	}
	r = runBinary(t, "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "serve") || !strings.Contains(r.stdout, "loopback") {
		t.Errorf("throttlectl --help does not show serve and its loopback default: %v", r)
	}
}
