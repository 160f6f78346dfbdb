package main

import (
	"strings"
	"testing"
	"time"
)

func TestThrottlectlDisplay(t *testing.T) {
	for in, want := range map[string]string{
		"tenant-42":  "tenant-42",
		"a{b}%c":     "a{b}%c",
		"ünï":        "ünï",
		"two words":  `"two words"`,
		"tab\there":  `"tab\there"`,
		"new\nline":  `"new\nline"`,
		`"quoted"`:   `"\"quoted\""`,
		"\xff":       `"\xff"`,
		"":           `""`,
		"\x1b[2Jbad": `"\x1b[2Jbad"`,
	} {
		if got := display(in); got != want {
			t.Errorf("display(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestThrottlectlSortByWait(t *testing.T) {
	states := []state{
		{redisKey: "c", allowed: true, resetAfter: time.Second},
		{redisKey: "b", retryAfter: time.Minute},
		{redisKey: "a", retryAfter: time.Second, blockedFor: time.Hour},
		{redisKey: "d", allowed: true, resetAfter: time.Second},
		{redisKey: "e", allowed: true, resetAfter: time.Hour},
	}
	sortByWait(states)
	var order []string
	for _, s := range states {
		order = append(order, s.redisKey)
	}
	if got := strings.Join(order, ""); got != "abecd" {
		t.Errorf("order %q, want abecd", got)
	}
}

func TestThrottlectlShortDurations(t *testing.T) {
	for in, want := range map[time.Duration]string{
		0:                "0s",
		time.Microsecond: "1ms",
		59*time.Minute + 59969903*time.Microsecond: "59m59.97s",
		2 * time.Hour:           "2h0m0s",
		1500 * time.Millisecond: "1.5s",
	} {
		if got := short(in); got != want {
			t.Errorf("short(%s) = %q, want %q", in, got, want)
		}
	}
}
