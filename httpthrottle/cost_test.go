package httpthrottle_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/httpthrottle"
	"github.com/jobthrottle/jobthrottle/internal/asynqtest"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// unitsSeen records each booked request's slot and units, on the Redis
// clock.
type unitsSeen struct {
	mu    sync.Mutex
	slots []time.Time
	units []int
}

func (u *unitsSeen) ObserveDecision(_ context.Context, d throttle.Decision) {
	if d.Op == throttle.OpReserve && d.Outcome == throttle.Admitted {
		u.mu.Lock()
		u.slots = append(u.slots, d.Slot)
		u.units = append(u.units, d.N)
		u.mu.Unlock()
	}
}

// TestRequestCostsAreCountedInUnits: requests that say in a header how
// many units of the partner's quota they take (1 or 4), under GCRA 20/s
// burst 4, from four goroutines. On the Redis clock no span between two
// slots holds more units than the policy allows; a request costing more
// than the burst fails with ErrExceedsLimit and is never sent; a cost
// function's error stops the request too.
func TestRequestCostsAreCountedInUnits(t *testing.T) {
	tg := redistest.New(t)
	up := newUpstream(t)
	seen := &unitsSeen{}
	cost := func(r *http.Request) (int, error) { return strconv.Atoi(r.Header.Get("X-Units")) }
	limiter, err := throttle.New(tg.NewClient(t), "limiter", throttle.GCRA{Rate: throttle.PerSecond(20), Burst: 4},
		throttle.WithPrefix(tg.Prefix), throttle.WithObserver(seen))
	if err != nil {
		t.Fatal(err)
	}
	transport, err := httpthrottle.NewTransport(limiter, httpthrottle.WithRequestCost(cost))
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: transport}
	send := func(units string) error {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, up.URL, nil)
		req.Header.Set("X-Units", units)
		resp, err := client.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return err
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				units := "1"
				if (g+i)%3 == 0 {
					units = "4"
				}
				if err := send(units); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if got := len(up.times()); got != 40 {
		t.Fatalf("the partner got %d requests, want 40", got)
	}
	seen.mu.Lock()
	var booked []asynqtest.Admission
	for i := range seen.slots {
		booked = append(booked, asynqtest.Admission{At: seen.slots[i], Units: seen.units[i]})
	}
	seen.mu.Unlock()
	asynqtest.CheckMeterUnits(t, booked, throttle.PerSecond(20), 4)
	if err := send("5"); !errors.Is(err, throttle.ErrExceedsLimit) {
		t.Errorf("a request of 5 units under a burst of 4: %v, want ErrExceedsLimit", err)
	}
	if err := send("x"); err == nil {
		t.Error("a cost function's error: the request was sent")
	}
	if err := send("0"); !errors.Is(err, throttle.ErrInvalidN) {
		t.Errorf("a cost of 0: %v, want ErrInvalidN", err)
	}
	if got := len(up.times()); got != 40 {
		t.Errorf("the partner got %d requests, want 40: refused ones were sent", got)
	}
}

// TestTransportPlans: one Transport, keyed by tenant, whose limiter gives
// the tenant "pro" a burst of 10 a minute and the others 2 (a plan). Within
// a short deadline the free tenant's third request and the pro tenant's
// eleventh are refused without being sent.
func TestTransportPlans(t *testing.T) {
	tg := redistest.New(t)
	up := newUpstream(t)
	plan := throttle.WithPlan(func(_ context.Context, tenant string) throttle.Policy {
		if tenant == "pro" {
			return throttle.GCRA{Rate: throttle.PerMinute(10), Burst: 10}
		}
		return nil
	})
	limiter, err := throttle.New(tg.NewClient(t), "limiter", throttle.GCRA{Rate: throttle.PerMinute(2), Burst: 2}, throttle.WithPrefix(tg.Prefix), plan)
	if err != nil {
		t.Fatal(err)
	}
	byTenant := func(r *http.Request) (string, error) { return r.Header.Get("X-Tenant"), nil }
	transport, err := httpthrottle.NewTransport(limiter, httpthrottle.WithRequestKey(byTenant))
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: transport}
	sent := func(tenant string) int {
		n := 0
		for range 12 {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, up.URL, nil)
			req.Header.Set("X-Tenant", tenant)
			resp, err := client.Do(req)
			cancel()
			if errors.Is(err, context.DeadlineExceeded) {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			n++
		}
		return n
	}
	if free, pro := sent("initech"), sent("pro"); free != 2 || pro != 10 {
		t.Errorf("sent %d for the free tenant and %d for the pro one, want 2 and 10", free, pro)
	}
	if got := len(up.times()); got != 12 {
		t.Errorf("the partner got %d requests, want 12", got)
	}
}
