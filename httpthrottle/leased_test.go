package httpthrottle_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/httpthrottle"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// leasedBlockAllowance is how long after a 429's block a client holding a
// leased share may still send: until its next renewal (every half lease)
// and the answer's way back, on a busy machine.
const leasedBlockAllowance = 150*time.Millisecond + 50*time.Millisecond

// TestLeasedSharesOutboundAndInbound: two Transports on limiters with
// leased shares (leases of 300 ms) keep the upstream within the policy and
// go quiet after its 429 within leasedBlockAllowance, until the block
// ends; a Middleware on one answers 429 beyond its policy.
func TestLeasedSharesOutboundAndInbound(t *testing.T) {
	tg := redistest.New(t)
	up := newUpstream(t)
	var blockedAt atomic.Int64
	up.tooMany = func(n int) (string, bool) {
		if n == 150 {
			blockedAt.Store(time.Now().UnixNano())
			return "2", true
		}
		return "", false
	}
	policy := throttle.GCRA{Rate: throttle.PerSecond(100), Burst: 10}
	var clients []*http.Client
	for range 2 {
		l, err := throttle.New(tg.NewClient(t), "leased-http", policy, throttle.WithPrefix(tg.Prefix),
			throttle.WithLeasedShares(300*time.Millisecond), throttle.WithLogger(nil))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		tr, err := httpthrottle.NewTransport(l)
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, &http.Client{Transport: tr})
	}
	stop := time.Now().Add(5 * time.Second)
	wa, wb := hammer(t, clients[0], up.URL, 4, stop), hammer(t, clients[1], up.URL, 4, stop)
	wa.Wait()
	wb.Wait()
	if blockedAt.Load() == 0 {
		t.Fatal("the upstream never answered 429")
	}
	at := time.Unix(0, blockedAt.Load())
	ts := up.times()
	var before, during, after []time.Time
	for _, a := range ts {
		switch {
		case a.Before(at):
			before = append(before, a)
		case a.After(at.Add(leasedBlockAllowance)) && a.Before(at.Add(2*time.Second)):
			during = append(during, a)
		case a.After(at.Add(2 * time.Second)):
			after = append(after, a)
		}
	}
	most := 0
	for i := range before {
		j := i
		for j < len(before) && before[j].Sub(before[i]) < time.Second {
			j++
		}
		most = max(most, j-i)
	}
	t.Logf("figures: %s: %d requests before the 429, at most %d in any second (policy 100/s, burst 10); %d in the block after %s; %d after it",
		tg.Kind, len(before), most, len(during), leasedBlockAllowance, len(after))
	if most > 110+1 {
		t.Errorf("%d requests reached the upstream in a second; the policy allows 110", most)
	}
	if len(during) != 0 {
		t.Errorf("%d requests reached the upstream during its block, past %s", len(during), leasedBlockAllowance)
	}
	if len(after) < 50 {
		t.Errorf("only %d requests after the block: the clients did not resume", len(after))
	}

	// Inbound: a flood beyond the policy gets 429s, the rest 200s.
	l, err := throttle.New(tg.NewClient(t), "leased-in", throttle.GCRA{Rate: throttle.PerSecond(50), Burst: 5},
		throttle.WithPrefix(tg.Prefix), throttle.WithLeasedShares(300*time.Millisecond), throttle.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	mw, err := httpthrottle.NewMiddleware(l)
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	codes := map[int]int{}
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		codes[rec.Code]++
	}
	t.Logf("figures: %s: inbound at about 1,000 a second, policy 50/s: %v", tg.Kind, codes)
	if codes[http.StatusOK] < 80 || codes[http.StatusOK] > 2*50+5+1 || codes[http.StatusTooManyRequests] == 0 {
		t.Errorf("answers %v; want about 100 OK in 2 s and the rest 429", codes)
	}
}
