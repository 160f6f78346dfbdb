package main

import (
	"testing"
	"time"
)

func TestWhileAllWaited(t *testing.T) {
	at := func(ms ...int) []time.Time {
		var ts []time.Time
		for _, m := range ms {
			ts = append(ts, time.UnixMilli(int64(m)))
		}
		return ts
	}
	for _, c := range []struct {
		name     string
		seen     map[string][]time.Time
		admitted map[string][]time.Time
		span     time.Duration
		got      map[string]int
	}{{
		name:     "one waits from 1s, the other from 2s, both until 4s",
		seen:     map[string][]time.Time{"a": at(1000, 1000), "b": at(2000, 2000)},
		admitted: map[string][]time.Time{"a": at(1500, 4000), "b": at(3000, 4000)},
		span:     2 * time.Second, got: map[string]int{"a": 1, "b": 2},
	}, {
		name:     "a gap where one had nothing waiting is left out",
		seen:     map[string][]time.Time{"a": at(0, 0, 0), "b": at(0, 2000)},
		admitted: map[string][]time.Time{"a": at(500, 2500, 3000), "b": at(1000, 3000)},
		span:     2 * time.Second, got: map[string]int{"a": 3, "b": 2},
	}, {
		name:     "seen and admitted at one instant waited no time",
		seen:     map[string][]time.Time{"a": at(0), "b": at(1000)},
		admitted: map[string][]time.Time{"a": at(2000), "b": at(1000)},
		span:     0, got: map[string]int{},
	}, {
		name:     "a tenant never seen",
		seen:     map[string][]time.Time{"a": at(0)},
		admitted: map[string][]time.Time{"a": at(2000)},
		span:     0, got: map[string]int{},
	}} {
		t.Run(c.name, func(t *testing.T) {
			span, got := whileAllWaited([]string{"a", "b"}, c.seen, c.admitted)
			if span != c.span || len(got) != len(c.got) {
				t.Fatalf("span %s, got %v; want %s, %v", span, got, c.span, c.got)
			}
			for k, v := range c.got {
				if got[k] != v {
					t.Errorf("got %v, want %v", got, c.got)
				}
			}
		})
	}
}
