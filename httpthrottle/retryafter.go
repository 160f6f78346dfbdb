package httpthrottle

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// retryAfter reads a Retry-After header: delay-seconds or an HTTP-date
// (RFC 9110, section 10.2.3). ok is false for a missing or unreadable one.
func retryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if strings.Trim(v, "0123456789") == "" {
		secs, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			secs = maxBlockSeconds // digits beyond int64: absurd, and as long
		}
		return time.Duration(min(secs, maxBlockSeconds)) * time.Second, true
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return min(max(0, at.Sub(now)), maxBlockSeconds*time.Second), true
}

// maxBlockSeconds keeps absurd Retry-After values from overflowing.
const maxBlockSeconds = 10 * 365 * 24 * 3600

// ceilSeconds rounds a duration up to whole seconds, at least minimum.
func ceilSeconds(d time.Duration, minimum int64) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	return max(s, minimum)
}
