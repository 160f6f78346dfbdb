package throttle

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// conn is what every limiter of this package shares: the client, the
// options, and how one exchange with Redis runs and fails.
type conn struct {
	client redis.UniversalClient
	cfg    config
	// deadlines reports whether client applies context deadlines to socket
	// reads; when it does not, timed calls run detached (see call).
	deadlines bool
	outages   *outageLog
}

// newConn validates the client and applies the options; name is the
// limiter's name unless WithName gave one.
func newConn(client redis.UniversalClient, name string, opts []Option) (conn, error) {
	if client == nil {
		return conn{}, fmt.Errorf("%w: nil redis client", ErrInvalidOption)
	}
	cfg := defaultConfig()
	for _, opt := range opts {
		if opt == nil {
			return conn{}, fmt.Errorf("%w: nil option", ErrInvalidOption)
		}
		if err := opt.apply(&cfg); err != nil {
			return conn{}, err
		}
	}
	if cfg.name == "" {
		cfg.name = name
	}
	return conn{client: client, cfg: cfg, deadlines: honoursDeadlines(client), outages: &outageLog{}}, nil
}

// reply is a script's integer reply, up to eight values, kept off the heap.
type reply struct {
	v [8]int64
	n int
}

// eval runs a decision script on keys with the given arguments under the
// timeout and returns its integer reply, which has at least five values.
func (c *conn) eval(ctx context.Context, script *redis.Script, keys []string, args []any) (reply, error) {
	r, err := c.evalAny(ctx, script, keys, args)
	if err == nil && r.n < 5 {
		err = errShortReply(r.n)
	}
	return r, err
}

// errShortReply reports a decision script's reply of fewer than five values.
func errShortReply(n int) error {
	return fmt.Errorf("script returned %d values, want 5 or more", n)
}

// evalAny runs a script under the timeout and returns its integer reply.
func (c *conn) evalAny(ctx context.Context, script *redis.Script, keys []string, args []any) (reply, error) {
	if c.cfg.timeout <= 0 {
		return runScript(ctx, c.client, script, keys, args)
	}
	var r reply
	err := c.call(ctx, func(ctx context.Context) error {
		var err error
		r, err = runScript(ctx, c.client, script, keys, args)
		return err
	})
	if err != nil {
		return reply{}, err // r may still be written by a detached call
	}
	return r, nil
}

// runScript runs a script (EVALSHA, EVAL when Redis does not know it) and
// reads its integer reply.
func runScript(ctx context.Context, client redis.UniversalClient, script *redis.Script, keys []string, args []any) (reply, error) {
	values, err := script.Run(ctx, client, keys, args...).Slice()
	if err != nil {
		return reply{}, err
	}
	return replyFrom(values)
}

// replyFrom reads a script's reply of integers.
func replyFrom(values []any) (reply, error) {
	var r reply
	if len(values) > len(r.v) {
		return reply{}, fmt.Errorf("script returned %d values, want at most %d", len(values), len(r.v))
	}
	for i, v := range values {
		n, ok := v.(int64)
		if !ok {
			return reply{}, fmt.Errorf("script returned %T at %d, want an integer", v, i)
		}
		r.v[i] = n
	}
	r.n = len(values)
	return r, nil
}

// call runs one Redis exchange under the configured timeout. go-redis
// applies a context's deadline to socket reads only when the client was
// built with ContextTimeoutEnabled; for other clients a timed exchange runs
// in a goroutine of its own, so the caller is answered at the deadline while
// the exchange ends within the client's ReadTimeout. When call returns at
// the deadline fn may still be running, so the caller reads what fn writes
// only after call returned nil.
func (c *conn) call(ctx context.Context, fn func(context.Context) error) error {
	if c.cfg.timeout <= 0 {
		return fn(ctx)
	}
	timed, cancel := context.WithTimeout(ctx, c.cfg.timeout)
	defer cancel()
	var err error
	if c.deadlines {
		err = fn(timed)
	} else {
		done := make(chan error, 1)
		go func() { done <- fn(timed) }()
		select {
		case err = <-done:
		case <-timed.Done():
			err = timed.Err()
		}
	}
	if err != nil && ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) && (timed.Err() != nil || isTimeout(err)) {
		// The client reports the deadline as its own timeout (a net error,
		// possibly a moment before the context's timer fires): say which
		// deadline passed.
		err = fmt.Errorf("%w after %s: %w", context.DeadlineExceeded, c.cfg.timeout, err)
	}
	return err
}

// isTimeout reports a network timeout.
func isTimeout(err error) bool {
	var netErr net.Error
	return errors.As(err, &netErr) && netErr.Timeout()
}

// unavailable wraps a failed call: the caller's own context error when the
// caller gave up, ErrUnavailable with the cause otherwise.
func (c *conn) unavailable(ctx context.Context, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return fmt.Errorf("throttle: %w", ctxErr)
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// failOpen reports whether a failed decision is to be allowed: the failure
// policy says so and the caller has not given up.
func (c *conn) failOpen(ctx context.Context) bool {
	return c.cfg.failure == FailOpen && ctx.Err() == nil
}

// del deletes keys of one Cluster slot under the timeout.
func (c *conn) del(ctx context.Context, keys ...string) error {
	err := c.call(ctx, func(ctx context.Context) error { return c.client.Del(ctx, keys...).Err() })
	if err != nil {
		return c.unavailable(ctx, err)
	}
	return nil
}

// honoursDeadlines reports whether c applies context deadlines to its
// socket reads.
func honoursDeadlines(c redis.UniversalClient) bool {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// validRequest checks a caller key and a unit count against a capacity.
func validRequest(key string, n, capacity int) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	case n < 1:
		return fmt.Errorf("%w: n must be at least 1, got %d", ErrInvalidN, n)
	case n > capacity:
		return fmt.Errorf("%w: n = %d, capacity %d", ErrExceedsLimit, n, capacity)
	}
	return nil
}

// resultOf converts a script's reply to a Result.
func resultOf(r reply, limit int) Result {
	return Result{
		Allowed:    r.v[0] == 1,
		Limit:      limit,
		Remaining:  int(r.v[1]),
		RetryAfter: micros(r.v[2]),
		ResetAfter: micros(r.v[3]),
		serverTime: r.v[4],
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
