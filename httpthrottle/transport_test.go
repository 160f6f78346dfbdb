package httpthrottle_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/httpthrottle"
	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// upstream is a partner API that records when each request arrived and can
// answer one of them with a 429.
type upstream struct {
	*httptest.Server
	mu       sync.Mutex
	arrivals []time.Time
	tooMany  func(n int) (retryAfter string, ok bool) // for the n-th request
}

func newUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.arrivals = append(u.arrivals, time.Now())
		n := len(u.arrivals)
		u.mu.Unlock()
		if u.tooMany != nil {
			if after, ok := u.tooMany(n); ok {
				w.Header().Set("Retry-After", after)
				w.WriteHeader(http.StatusTooManyRequests)
				return
			}
		}
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) times() []time.Time {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := append([]time.Time(nil), u.arrivals...)
	sort.Slice(out, func(i, j int) bool { return out[i].Before(out[j]) })
	return out
}

// newClient returns an http.Client whose Transport paces on its own
// connection pool to the target's Redis: a separate process, in effect.
// The limiter's decisions go to seen, when given.
func newClient(t *testing.T, tg *redistest.Target, p throttle.Policy, opts ...httpthrottle.TransportOption) (*http.Client, *throttle.Limiter) {
	t.Helper()
	return newObservedClient(t, tg, p, nil, opts...)
}

func newObservedClient(t *testing.T, tg *redistest.Target, p throttle.Policy, seen *slots, opts ...httpthrottle.TransportOption) (*http.Client, *throttle.Limiter) {
	t.Helper()
	limiterOpts := []throttle.Option{throttle.WithPrefix(tg.Prefix)}
	if seen != nil {
		limiterOpts = append(limiterOpts, throttle.WithObserver(seen))
	}
	limiter, err := throttle.New(tg.NewClient(t), "limiter", p, limiterOpts...)
	if err != nil {
		t.Fatal(err)
	}
	transport, err := httpthrottle.NewTransport(limiter, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Transport: transport}, limiter
}

// hammer sends GETs to url from workers goroutines until stop. Each
// request may wait for its slot until 5 s after stop: one whose wait its
// deadline cut short would give its slot back, and the next request would
// book that slot again, so a slot would be booked twice and used once.
func hammer(t *testing.T, c *http.Client, url string, workers int, stop time.Time) *sync.WaitGroup {
	t.Helper()
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				ctx, cancel := context.WithDeadline(context.Background(), stop.Add(5*time.Second))
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
				resp, err := c.Do(req)
				cancel()
				if err != nil {
					if !errors.Is(err, context.DeadlineExceeded) {
						t.Error(err)
					}
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	return &wg
}

// slots records the start of every slot a limiter booked, on the Redis
// clock (throttle.Decision.Slot). It is a throttle.Observer.
type slots struct {
	mu sync.Mutex
	at []time.Time
}

func (s *slots) ObserveDecision(_ context.Context, d throttle.Decision) {
	if d.Op == throttle.OpReserve && d.Outcome == throttle.Admitted {
		s.mu.Lock()
		s.at = append(s.at, d.Slot)
		s.mu.Unlock()
	}
}

func (s *slots) sorted() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := append([]time.Time(nil), s.at...)
	sort.Slice(out, func(i, j int) bool { return out[i].Before(out[j]) })
	return out
}

// TestTwoClientsShareTheLimit: two clients with separate Transports on one
// Redis, 10/s per host. On the Redis clock, where the limiter decides, no
// second holds more slots than the policy allows (10/s and a burst of 1:
// 11 in a closed second); every request reaches the upstream no sooner
// than its slot and at most ArrivalJitter after it, so no window of a
// second less ArrivalJitter holds more than 11 arrivals; and 10/s is
// achieved within 10% over 5 s.
func TestTwoClientsShareTheLimit(t *testing.T) {
	tg := redistest.New(t)
	up := newUpstream(t)
	policy := throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1}
	var booked slots
	a, _ := newObservedClient(t, tg, policy, &booked)
	b, _ := newObservedClient(t, tg, policy, &booked)
	stop := time.Now().Add(5 * time.Second)
	wa, wb := hammer(t, a, up.URL, 3, stop), hammer(t, b, up.URL, 3, stop)
	wa.Wait()
	wb.Wait()
	ts := up.times()
	asynqtest.CheckArrivals(t, "upstream", ts, booked.sorted(), redistest.ClockOffset(t, tg.Client), time.Second, 11)
	n := 0 // the requests of the 5 s (those sent before stop arrive a little after)
	for _, at := range ts {
		if at.Before(stop) {
			n++
		}
	}
	if n < 45 || n > 55 {
		t.Errorf("%d requests in 5 s; want 50 ± 10%%", n)
	}
	t.Logf("%d requests in 5 s, %d in all over %s", n, len(ts), ts[len(ts)-1].Sub(ts[0]).Round(time.Millisecond))
}

// TestA429BlocksEveryClient: one 429 with Retry-After: 2 silences both
// clients for 2 s; then they resume.
func TestA429BlocksEveryClient(t *testing.T) {
	tg := redistest.New(t)
	up := newUpstream(t)
	var blockedAt atomic.Int64
	up.tooMany = func(n int) (string, bool) {
		if n == 8 {
			blockedAt.Store(time.Now().UnixNano())
			return "2", true
		}
		return "", false
	}
	policy := throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1}
	a, _ := newClient(t, tg, policy)
	b, _ := newClient(t, tg, policy)
	stop := time.Now().Add(4 * time.Second)
	wa, wb := hammer(t, a, up.URL, 2, stop), hammer(t, b, up.URL, 2, stop)
	wa.Wait()
	wb.Wait()
	at := time.Unix(0, blockedAt.Load())
	if blockedAt.Load() == 0 {
		t.Fatal("the upstream never answered 429")
	}
	var during, after int
	for _, ts := range up.times() {
		switch {
		case ts.After(at.Add(20*time.Millisecond)) && ts.Before(at.Add(2*time.Second)):
			during++
		case ts.After(at.Add(2 * time.Second)):
			after++
		}
	}
	if during != 0 {
		t.Errorf("%d requests reached the upstream during the 2 s it asked for", during)
	}
	if after < 5 {
		t.Errorf("only %d requests after the block: the clients did not resume", after)
	}
}

func TestRetriesAfterTheBlockOnlyWhatIsSafeToReplay(t *testing.T) {
	tg := redistest.New(t)
	up := newUpstream(t)
	up.tooMany = func(n int) (string, bool) { return "1", n == 1 || n == 3 }
	c, _ := newClient(t, tg, throttle.GCRA{Rate: throttle.PerSecond(100), Burst: 10}, httpthrottle.WithRetries(1))

	start := time.Now()
	resp, err := c.Post(up.URL, "text/plain", strings.NewReader("payload"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a POST was retried: %d", resp.StatusCode)
	}
	req, _ := http.NewRequest(http.MethodPut, up.URL, strings.NewReader("payload"))
	resp, err = c.Do(req) // request 2: fine
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	req, _ = http.NewRequest(http.MethodPut, up.URL, strings.NewReader("payload"))
	resp, err = c.Do(req) // request 3: 429, retried as request 4 after 1 s
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || len(up.times()) != 4 {
		t.Fatalf("a PUT with a replayable body: %d after %d requests; want retried once", resp.StatusCode, len(up.times()))
	}
	if gap := up.times()[3].Sub(up.times()[2]); gap < 990*time.Millisecond {
		t.Fatalf("retried %s after the 429's Retry-After: 1", gap)
	}
	_ = start
}

// TestARetryPastTheDeadlineReturnsTheAnswer: with retries on, a 429 whose
// Retry-After outlasts the request's context comes back to the caller as
// it came, not as an error of a retry that could not have been sent.
func TestARetryPastTheDeadlineReturnsTheAnswer(t *testing.T) {
	tg := redistest.New(t)
	up := newUpstream(t)
	up.tooMany = func(n int) (string, bool) { return "5", n == 1 }
	c, _ := newClient(t, tg, throttle.GCRA{Rate: throttle.PerSecond(100), Burst: 10}, httpthrottle.WithRetries(1))
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, up.URL, nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("a 429 with Retry-After: 5 and 1 s to go: %v; want the 429", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "5" || len(up.times()) != 1 {
		t.Fatalf("%d, Retry-After %q, %d requests sent; want the 429 as it came, sent once", resp.StatusCode, resp.Header.Get("Retry-After"), len(up.times()))
	}
}

func TestTransportRefusesADeadlineItCannotMeet(t *testing.T) {
	tg := redistest.New(t)
	up := newUpstream(t)
	c, limiter := newClient(t, tg, throttle.GCRA{Rate: throttle.PerMinute(1), Burst: 1})
	if _, err := limiter.Allow(context.Background(), strings.TrimPrefix(up.URL, "http://")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, up.URL, nil)
	start := time.Now()
	_, err := c.Do(req)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 500*time.Millisecond {
		t.Fatalf("a turn a minute away with 1 s to go: %v after %s; want DeadlineExceeded at once", err, time.Since(start))
	}
	if n := len(up.times()); n != 0 {
		t.Fatalf("%d requests were sent", n)
	}
}

func TestTransportOptionsAndKeys(t *testing.T) {
	tg := redistest.Embedded(t)
	limiter, _ := throttle.New(tg.Client, "limiter", throttle.GCRA{Rate: throttle.PerSecond(1), Burst: 1})
	for _, opt := range []httpthrottle.TransportOption{nil, httpthrottle.WithBase(nil), httpthrottle.WithRequestKey(nil), httpthrottle.WithRetries(-1), httpthrottle.WithMaxBlock(0)} {
		if _, err := httpthrottle.NewTransport(limiter, opt); !errors.Is(err, httpthrottle.ErrInvalidOption) {
			t.Errorf("option %v: %v", opt, err)
		}
	}
	if _, err := httpthrottle.NewTransport(nil); !errors.Is(err, httpthrottle.ErrInvalidOption) {
		t.Errorf("nil limiter: %v", err)
	}
	tr, _ := httpthrottle.NewTransport(limiter, httpthrottle.WithRequestKey(func(*http.Request) (string, error) {
		return "", errors.New("no account")
	}))
	req := httptest.NewRequest(http.MethodGet, "http://partner.example/", nil)
	if _, err := tr.RoundTrip(req); !errors.Is(err, httpthrottle.ErrNoKey) || !strings.Contains(err.Error(), "no account") {
		t.Errorf("a request the key function refuses: %v; want ErrNoKey, with the function's error", err)
	}
}
