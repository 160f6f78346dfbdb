package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// lockedBuffer is a strings.Builder safe for the demo's writes and the
// test's reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

var dashboardLine = regexp.MustCompile(`(?m)^Dashboard, while the fleet runs: (http://127\.0\.0\.1:\d+/)\n  actions token: ([0-9a-f]{32})$`)

// TestDemoDashboard runs the demo with --dashboard on a free loopback
// port: it prints the URL and token before the first frame, and the
// dashboard lists the demo's limiters while the fleet runs.
func TestDemoDashboard(t *testing.T) {
	args := []string{"--duration", "20s", "--tasks", "200", "--batch", "0", "--exports", "2", "--dashboard", "127.0.0.1:0"}
	addr, mini := testRedis(t)
	args = append(args, "--redis", addr)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errs lockedBuffer
	exit := make(chan int, 1)
	go func() { exit <- run(ctx, args, &out, &errs, noEnv) }()

	var url string
	for deadline := time.Now().Add(15 * time.Second); url == ""; time.Sleep(20 * time.Millisecond) {
		if m := dashboardLine.FindStringSubmatch(out.String()); m != nil {
			url = m[1]
		} else if time.Now().After(deadline) {
			cancel()
			<-exit
			t.Fatalf("no dashboard URL and token printed:\n%s\nstderr:\n%s", out.String(), errs.String())
		}
	}
	if first, at := strings.Index(out.String(), "calls "), strings.Index(out.String(), url); first >= 0 && first < at {
		t.Errorf("the dashboard's URL comes after the first frame:\n%s", out.String())
	}

	// The limiters appear once they have decided and the Publisher has
	// flushed (every 2 s).
	var names []string
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		names = overviewNames(t, url)
		if len(names) >= 2 || time.Now().After(deadline) {
			break
		}
	}
	if len(names) < 2 {
		t.Errorf("api/overview lists limiters %q, want the demo's (tenant, overall, exports)", names)
	}

	cancel() // the rest of the run proves nothing more here
	if code := <-exit; code != 0 && code != exitInterrupted {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errs.String())
	}
	checkFits(t, "stdout", out.String())
	if _, err := http.Get(url + "api/overview"); err == nil {
		t.Errorf("the dashboard still serves after the demo ended")
	}
	if mini != nil {
		if keys := mini.Keys(); len(keys) > 0 {
			t.Errorf("keys left in a Redis that had none before the demo: %q", keys)
		}
	} else if os.Getenv("REDIS_ADDR") != "" {
		id := keysLine.FindStringSubmatch(out.String())
		if id != nil {
			rdb := redis.NewClient(&redis.Options{Addr: addr})
			defer rdb.Close()
			assertNoKeysOf(t, rdb, id[1])
		}
	}
}

// overviewNames fetches the dashboard's api/overview and returns the names
// of the limiters it lists.
func overviewNames(t *testing.T, url string) []string {
	t.Helper()
	resp, err := http.Get(url + "api/overview")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET api/overview: status %d: %s", resp.StatusCode, body)
	}
	var overview struct {
		Limiters []struct {
			Name string `json:"name"`
		} `json:"limiters"`
	}
	if err := json.Unmarshal(body, &overview); err != nil {
		t.Fatalf("GET api/overview: not JSON: %v: %s", err, body)
	}
	var names []string
	for _, l := range overview.Limiters {
		if l.Name == "" {
			t.Errorf("a limiter without a name in %s", body)
		}
		names = append(names, l.Name)
	}
	return names
}

// TestDemoDashboardStaysUpForTheDuration: with --dashboard the run lasts
// the whole --duration, though its tasks are done within a few seconds
// (40 at 20/s), so that the dashboard can still be looked at; without it,
// the run ends with the work.
func TestDemoDashboardStaysUpForTheDuration(t *testing.T) {
	const duration = 10 * time.Second
	args := []string{"--duration", duration.String(), "--tasks", "40", "--batch", "0", "--exports", "1", "--dashboard", "127.0.0.1:0"}
	addr, _ := testRedis(t)
	args = append(args, "--redis", addr)
	var out, errs lockedBuffer
	exit := make(chan int, 1)
	started := time.Now()
	go func() { exit <- run(context.Background(), args, &out, &errs, noEnv) }()
	var url string
	for deadline := time.Now().Add(15 * time.Second); url == ""; time.Sleep(20 * time.Millisecond) {
		if m := dashboardLine.FindStringSubmatch(out.String()); m != nil {
			url = m[1]
		} else if time.Now().After(deadline) {
			t.Fatalf("no dashboard URL printed:\n%s\nstderr:\n%s", out.String(), errs.String())
		}
	}
	time.Sleep(time.Until(started.Add(duration - 2*time.Second)))
	select {
	case code := <-exit:
		t.Fatalf("the run ended after %s (exit %d), before its --duration of %s:\n%s", time.Since(started).Round(time.Millisecond), code, duration, out.String())
	default:
	}
	if names := overviewNames(t, url); len(names) == 0 {
		t.Errorf("api/overview lists no limiter %s into the run", time.Since(started).Round(time.Millisecond))
	}
	if code := <-exit; code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errs.String())
	}
	if took := time.Since(started); took < duration {
		t.Errorf("the run took %s, want its --duration, %s", took.Round(time.Millisecond), duration)
	}
}
