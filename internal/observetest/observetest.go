// Package observetest records what several observers are told, for the
// tests of the options that take more than one observer (throttle's and
// worker's WithObserver). A Log is safe for concurrent use.
package observetest

import (
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
)

// Log is a set of observers writing, in turn, to one log: each records the
// values it was given (decisions, events) and a line summing up each.
type Log[T any] struct {
	mu    sync.Mutex
	lines []string
	seen  [][]T // by observer
}

// Add makes room for one more observer and returns its number.
func (l *Log[T]) Add() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seen = append(l.seen, nil)
	return len(l.seen) - 1
}

// Record is observer i's record of v, summed up as line.
func (l *Log[T]) Record(i int, line string, v T) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf("%d: %s", i, line))
	l.seen[i] = append(l.seen[i], v)
}

// CheckOrder checks that each of n observers saw every value (each summed
// up in want), in order, observer 0 first, and that they all saw the same
// values.
func (l *Log[T]) CheckOrder(t testing.TB, n int, want []string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var lines []string
	for _, w := range want {
		for i := range n {
			lines = append(lines, fmt.Sprintf("%d: %s", i, w))
		}
	}
	if strings.Join(l.lines, "\n") != strings.Join(lines, "\n") {
		t.Errorf("observed:\n%s\nwant:\n%s", strings.Join(l.lines, "\n"), strings.Join(lines, "\n"))
	}
	for i := 1; i < n; i++ {
		if !reflect.DeepEqual(l.seen[i], l.seen[0]) {
			t.Errorf("observer %d was told other things than observer 0:\n%+v\n%+v", i, l.seen[i], l.seen[0])
		}
	}
}
