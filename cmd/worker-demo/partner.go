package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"time"
)

// partnerAPI is the fake partner the tasks call: it records when each call
// arrived, for which tenant, so the demo can check the limits held where
// they matter, at the partner.
type partnerAPI struct {
	*httptest.Server
	mu    sync.Mutex
	calls map[string][]time.Time // tenant → arrival times
}

func newPartnerAPI() *partnerAPI {
	p := &partnerAPI{calls: map[string][]time.Time{}}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tenant := r.Header.Get("X-Tenant")
		p.mu.Lock()
		p.calls[tenant] = append(p.calls[tenant], time.Now())
		p.mu.Unlock()
		_, _ = io.WriteString(w, "synced")
	}))
	return p
}

// arrivals returns the arrival times of a tenant's calls ("" for all), in
// order.
func (p *partnerAPI) arrivals(tenant string) []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []time.Time
	for t, calls := range p.calls {
		if tenant == "" || t == tenant {
			out = append(out, calls...)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Before(out[j]) })
	return out
}

// mostInAny returns the most of the sorted instants ts within any closed
// window of w.
func mostInAny(ts []time.Time, w time.Duration) int {
	most := 0
	for i := range ts {
		j := i
		for j < len(ts) && ts[j].Sub(ts[i]) <= w {
			j++
		}
		most = max(most, j-i)
	}
	return most
}

// inLastSecond counts the calls of the last second before now.
func inLastSecond(ts []time.Time, now time.Time) int {
	n := 0
	for i := len(ts) - 1; i >= 0 && now.Sub(ts[i]) < time.Second; i-- {
		n++
	}
	return n
}
