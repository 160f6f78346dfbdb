package dashboard_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/dashboard"
	"github.com/jobthrottle/jobthrottle/internal/gate"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// TestKeyPageListsOnlyBookingsAhead: a key's bookings ahead are the
// tickets whose slots are still to come, soonest first; a ticket whose
// slot has passed (it lives on until its TTL) is not listed. On a driven
// Redis clock: four tasks book one slot a second, then 2.5 s pass.
func TestKeyPageListsOnlyBookingsAhead(t *testing.T) {
	tg := redistest.Embedded(t)
	clock := tg.Clock(t)
	ctx := context.Background()
	l, err := throttle.New(tg.Client, "partner-api", throttle.GCRA{Rate: throttle.PerSecond(1), Burst: 1}, throttle.WithPrefix(tg.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		b, err := gate.ReserveFor(ctx, l, "acme", gate.Ticket{ID: fmt.Sprintf("task-%d", 3-i), Grace: time.Minute}, 1, time.Minute)
		if err != nil || !b.OK {
			t.Fatalf("booking %d: %+v, %v", i, b, err)
		}
	}
	clock.Advance(2500 * time.Millisecond)
	h, err := dashboard.New(tg.Client, dashboard.WithPrefix(tg.Prefix), dashboard.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	s := &site{tgt: tg, limiter: l, srv: httptestServer(t, http.StripPrefix("/ops", h))}
	var key struct {
		Bookings struct {
			Tickets []struct {
				Ticket string `json:"ticket"`
				InMs   int64  `json:"inMs"`
			} `json:"tickets"`
		} `json:"bookings"`
	}
	s.getJSON(t, "/ops/api/key?"+q("name", "partner-api", "key", "acme"), &key)
	// The slots end 1, 2, 3 and 4 s after the first booking: 0.5 s and
	// 1.5 s from now are still to come.
	got := key.Bookings.Tickets
	if len(got) != 2 || got[0].Ticket != "task-1" || got[0].InMs != 500 || got[1].Ticket != "task-0" || got[1].InMs != 1500 {
		t.Errorf("bookings ahead %+v, want task-1 in 500 ms, then task-0 in 1500 ms", got)
	}
}
