// Package bounded runs the library's calls to Redis so that a caller is
// answered by the time its context ends, whatever the client's options, and
// runs the clean-up that must outlive a caller (giving back a booking,
// releasing a lease, handing a task over) detached from it, within a bound.
//
// go-redis applies a context's deadline to socket reads only when the client
// is built with ContextTimeoutEnabled, and never its cancellation; and it
// retries a read that timed out. Without this package a call to a Redis that
// hangs holds its caller for the client's ReadTimeout times its retries (5 to
// 10 s with go-redis's defaults), however early the caller's context ends.
//
// Every function is safe for concurrent use.
package bounded

import (
	"context"
	"time"
)

// Call runs fn, one exchange with Redis, under ctx. It returns fn's error;
// or, when ctx ends first, ctx's error at once, leaving fn to finish in the
// background (it ends with the client's own timeouts). fn must write what
// the caller reads only through variables the caller reads after Call
// returned nil: a call abandoned at ctx's end may still write them later.
//
// A context that can never end (context.Background()) costs nothing; any
// other runs fn on a goroutine of its own, about a microsecond.
func Call(ctx context.Context, fn func(context.Context) error) error {
	if ctx.Done() == nil {
		return fn(ctx)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		select {
		case err := <-done: // answered at the same moment: keep the answer
			return err
		default:
			return ctx.Err()
		}
	}
}

// Detached runs fn, clean-up that must happen even though the caller's ctx
// may be ending, under a context that keeps ctx's values but not its
// cancellation, and ends after limit. While ctx lives the caller waits for
// fn and gets its error; when ctx ends first (or had ended already), Detached
// returns ctx's error at once and fn goes on in the background until it is
// done or limit has passed.
func Detached(ctx context.Context, limit time.Duration, fn func(context.Context) error) error {
	detached, cancel := context.WithTimeout(context.WithoutCancel(ctx), limit)
	if ctx.Done() == nil {
		defer cancel()
		return Call(detached, fn)
	}
	done := make(chan error, 1)
	go func() {
		defer cancel()
		done <- Call(detached, fn)
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		select {
		case err := <-done:
			return err
		default:
			return ctx.Err()
		}
	}
}

// Finish runs fn, clean-up whose outcome the caller must know (handing a
// task over to a copy of itself before the task ends), to its end: under a
// context that keeps ctx's values but not its cancellation, ending after
// limit, and waits for it whether or not ctx has ended.
func Finish(ctx context.Context, limit time.Duration, fn func(context.Context) error) error {
	detached, cancel := context.WithTimeout(context.WithoutCancel(ctx), limit)
	defer cancel()
	return Call(detached, fn)
}

// CleanupLimit is how long clean-up run by [Detached] may take after its
// caller has gone, unless a caller bounds it otherwise: long enough to ride
// out a Redis failover, short enough that abandoned clean-up never piles up.
const CleanupLimit = 5 * time.Second
