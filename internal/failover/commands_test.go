//go:build failover

package failover

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/throttle"
)

// build compiles a command of the module into dir and returns its path.
func build(t *testing.T, dir, pkg string) string {
	t.Helper()
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", out, "../../"+pkg)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}

// TestCommandsTakeSentinels: throttlectl, its dashboard (serve) and the
// demo reach a master through its Sentinels (--sentinel), and throttlectl
// still answers after the master fails over.
func TestCommandsTakeSentinels(t *testing.T) {
	s := startSentinels(t)
	dir := t.TempDir()
	ctl, demo := build(t, dir, "cmd/throttlectl"), build(t, dir, "cmd/worker-demo")
	sentinels := strings.Join(s.addrs(), ",")

	out, err := exec.Command(demo, "--redis", sentinels, "--sentinel", masterName,
		"--duration", "30s", "--tasks", "60", "--batch", "10", "--exports", "2").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "\nThe fleet held the policy.\n") ||
		!strings.Contains(string(out), "Redis behind Sentinel "+sentinels) ||
		!strings.Contains(string(out), "--sentinel "+masterName+" --prefix") {
		t.Fatalf("worker-demo on Sentinels: %v\n%s", err, out)
	}

	// A key of a limiter's, seen by throttlectl before and after a failover.
	client := s.client(t)
	lim, err := throttle.New(client, "probe", throttle.GCRA{Rate: throttle.PerMinute(1), Burst: 1}, throttle.WithPrefix("jt-cmd:"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for range 2 {
		if _, err := lim.Allow(ctx, "k"); err != nil {
			t.Fatal(err)
		}
	}
	peek := func() string {
		t.Helper()
		out, err := exec.Command(ctl, "--redis", sentinels, "--sentinel", masterName, "--prefix", "jt-cmd:",
			"peek", "--name", "probe", "--policy", "gcra:1/1m:1", "k").CombinedOutput()
		if err != nil {
			t.Fatalf("throttlectl peek: %v\n%s", err, out)
		}
		return string(out)
	}
	throttled := func(out string) bool { return strings.Contains(out, " no ") && strings.Contains(out, " 0/1 ") }
	before := peek()
	if !throttled(before) {
		t.Fatalf("throttlectl peek does not show the key throttled (no, 0/1 remaining):\n%s", before)
	}
	replicated(t, s.master, s.replica)
	s.master.kill()
	// A new process asks the Sentinels for the master: wait until they name
	// the promoted replica, as an operator would see them do.
	waitUntil(t, 30*time.Second, "the Sentinels did not announce the promoted replica", func() bool { return s.announced(t) })
	if after := peek(); !throttled(after) {
		t.Fatalf("throttlectl peek after the failover:\n%s\nbefore it:\n%s", after, before)
	}

	// The dashboard, served on the Sentinels' master.
	serve := exec.Command(ctl, "--redis", sentinels, "--sentinel", masterName, "--prefix", "jt-cmd:", "serve", "--addr", "127.0.0.1:0")
	stdout, err := serve.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = serve.Process.Kill(); _ = serve.Wait() })
	url := ""
	lines := bufio.NewScanner(stdout)
	for url == "" && lines.Scan() {
		if i := strings.Index(lines.Text(), "http://"); i >= 0 {
			url = strings.Fields(lines.Text()[i:])[0]
		}
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	if url == "" {
		t.Fatal("throttlectl serve printed no address")
	}
	resp, err := http.Get(url + "api/overview")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "probe") {
		t.Fatalf("the dashboard on Sentinels: %s\n%s", resp.Status, body)
	}
	t.Logf("figures: worker-demo, throttlectl peek (before and after a failover) and serve ran on a master behind Sentinels")
}
