package httpthrottle

import (
	"net/http"
	"testing"
	"time"
)

// TestRetryAfterReadsSecondsAndDates: delay-seconds and HTTP dates, what
// is not either (a negative number, a fraction, words) read as unreadable,
// and absurd values (beyond int64 too, or a date centuries away) capped at
// maxBlockSeconds rather than read as none.
func TestRetryAfterReadsSecondsAndDates(t *testing.T) {
	now := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	most := maxBlockSeconds * time.Second
	for _, tc := range []struct {
		header string
		want   time.Duration
		ok     bool
	}{
		{"", 0, false},
		{"0", 0, true},
		{" 120 ", 2 * time.Minute, true},
		{"-5", 0, false},
		{"1.5", 0, false},
		{"soon", 0, false},
		{"9999999999", most, true},
		{"99999999999999999999", most, true},
		{"Sat, 05 Dec 2026 10:00:30 GMT", 30 * time.Second, true},
		{"Sat, 05 Dec 2026 09:59:00 GMT", 0, true},
		{"Sat, 05 Dec 2226 10:00:00 GMT", most, true},
	} {
		h := http.Header{}
		if tc.header != "" {
			h.Set("Retry-After", tc.header)
		}
		got, ok := retryAfter(h, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("Retry-After %q: %s, %v; want %s, %v", tc.header, got, ok, tc.want, tc.ok)
		}
	}
}
