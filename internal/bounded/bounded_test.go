package bounded_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/bounded"
)

var errAnswer = errors.New("answered")

// block is an exchange that never answers until released.
func block(release <-chan struct{}) func(context.Context) error {
	return func(context.Context) error {
		<-release
		return errAnswer
	}
}

func TestCallAnswersAtTheContextsEnd(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := bounded.Call(ctx, block(release)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Call on a hung exchange: %v; want DeadlineExceeded", err)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	time.AfterFunc(10*time.Millisecond, cancel)
	if err := bounded.Call(cancelled, block(release)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Call on a hung exchange: %v; want Canceled", err)
	}
	if err := bounded.Call(cancelled, func(context.Context) error { t.Error("ran with an ended context"); return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("Call with an ended context: %v", err)
	}
}

func TestCallReturnsTheAnswer(t *testing.T) {
	for _, ctx := range []context.Context{context.Background(), t.Context()} {
		got := 0
		err := bounded.Call(ctx, func(context.Context) error { got = 7; return errAnswer })
		if !errors.Is(err, errAnswer) || got != 7 {
			t.Fatalf("Call: %v, %d", err, got)
		}
	}
}

func TestDetachedOutlivesItsCaller(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan error, 1)
	err := bounded.Detached(ctx, time.Second, func(ctx context.Context) error {
		time.Sleep(20 * time.Millisecond)
		done <- ctx.Err() // still alive: the caller's cancellation did not reach it
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Detached with an ended context: %v; want Canceled at once", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the clean-up ran with an ended context: %v", err)
	}
}

func TestDetachedIsBounded(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	err := bounded.Detached(context.Background(), 20*time.Millisecond, block(release))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Detached on a hung exchange: %v; want DeadlineExceeded at its limit", err)
	}
	err = bounded.Detached(t.Context(), 20*time.Millisecond, block(release))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Detached on a hung exchange, living caller: %v; want DeadlineExceeded at its limit", err)
	}
	if err := bounded.Detached(t.Context(), time.Second, func(context.Context) error { return errAnswer }); !errors.Is(err, errAnswer) {
		t.Fatalf("Detached: %v; want the answer", err)
	}
}

func TestFinishWaitsWhateverTheCaller(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran := false
	err := bounded.Finish(ctx, time.Second, func(ctx context.Context) error {
		time.Sleep(10 * time.Millisecond)
		ran = ctx.Err() == nil
		return errAnswer
	})
	if !errors.Is(err, errAnswer) || !ran {
		t.Fatalf("Finish with an ended context: %v, ran with a live context: %v", err, ran)
	}
	release := make(chan struct{})
	defer close(release)
	if err := bounded.Finish(context.Background(), 20*time.Millisecond, block(release)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Finish on a hung exchange: %v; want DeadlineExceeded at its limit", err)
	}
}
