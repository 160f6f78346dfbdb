package throttle

import (
	"fmt"
	"strconv"
	"testing"
	"time"
)

// BenchmarkDenyCacheFull measures remembering a rejection of a new key
// while the cache is full of rejections that still hold: the case that
// once swept the whole cache on every call (0.13–0.2 ms at 1,000 keys,
// 2.6–3.7 ms at 200,000).
func BenchmarkDenyCacheFull(b *testing.B) {
	for _, size := range []int{1_000, 200_000} {
		b.Run("size="+strconv.Itoa(size), func(b *testing.B) {
			c := newDenyCache(size)
			now := time.Now()
			live := Result{RetryAfter: time.Hour, ResetAfter: time.Hour}
			for i := range size {
				c.remember("full-"+strconv.Itoa(i), 1, "p", live, now)
			}
			keys := make([]string, 4096)
			for i := range keys {
				keys[i] = "new-" + strconv.Itoa(i)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				c.remember(keys[i%len(keys)], 1, "p", live, now)
			}
		})
	}
}

// TestDenyCacheStaysBounded: under churn (keys rejected, admitted and
// rejected again, rejections running out) the cache never holds more than
// its size, drops what ran out as new rejections come, and its expiry heap
// stays within a constant factor of the live entries.
func TestDenyCacheStaysBounded(t *testing.T) {
	const size = 100
	c := newDenyCache(size)
	now := time.Now()
	for round := range 50 {
		for i := range 300 {
			key := fmt.Sprintf("k%d", (round*37+i)%500)
			wait := time.Duration(1+(i%7)) * time.Millisecond
			c.remember(key, 1, "p", Result{RetryAfter: wait, ResetAfter: wait}, now)
			if i%3 == 0 {
				c.forget(key)
			}
			if n, heapLen := len(c.entries), len(c.expiry); n > size || heapLen > 2*n+64+1 {
				t.Fatalf("round %d: %d entries, %d in the heap; want at most %d and 2n+65", round, n, heapLen, size)
			}
		}
		now = now.Add(4 * time.Millisecond)
	}
	// Everything remembered has run out: one new rejection drops it all.
	now = now.Add(time.Second)
	c.remember("last", 1, "p", Result{RetryAfter: time.Second}, now)
	if len(c.entries) != 1 {
		t.Fatalf("%d entries after every other rejection ran out; want 1", len(c.entries))
	}
	if r, ok := c.lookup("last", 1, "p", 3, now); !ok || r.RetryAfter != time.Second {
		t.Fatalf("lookup of the live rejection: %+v, %v", r, ok)
	}
	// A cache full of live rejections keeps them and turns the new one away.
	full := newDenyCache(2)
	long := Result{RetryAfter: time.Hour}
	full.remember("a", 1, "p", long, now)
	full.remember("b", 1, "p", long, now)
	full.remember("c", 1, "p", long, now)
	if _, ok := full.lookup("c", 1, "p", 3, now); ok || len(full.entries) != 2 {
		t.Fatalf("a full cache took a new key: %d entries", len(full.entries))
	}
}
