package throttle

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/jobthrottle/jobthrottle/internal/bounded"
	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/jobthrottle/jobthrottle/internal/ratelog"
	"github.com/jobthrottle/jobthrottle/internal/redisclient"
	"github.com/redis/go-redis/v9"
)

// conn is what every limiter of this package shares: the client, the
// options, and how one exchange with Redis runs and fails.
type conn struct {
	client  redis.UniversalClient
	cfg     config
	outages *ratelog.Every // Redis failures logged
	// fixed is the policy of a ConcurrencyLimiter, which decisions carry
	// as theirs ("conc:3/30s"); a Limiter's come with each Result.
	fixed string
	// registry records the limiter in the registry of names.
	registry *registration
}

// newConn validates the client, the limiter's name and the options.
func newConn(client redis.UniversalClient, name string, opts []Option) (conn, error) {
	if redisclient.IsNil(client) {
		return conn{}, fmt.Errorf("%w: nil redis client", ErrInvalidOption)
	}
	redisclient.FollowFailovers(client)
	if err := validName(name); err != nil {
		return conn{}, fmt.Errorf("%w: the limiter's name: %w", ErrInvalidOption, err)
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
	cfg.name = name
	if cfg.acks > 0 {
		if _, ring := client.(*redis.Ring); ring {
			return conn{}, fmt.Errorf("%w: WithReplicaAcks needs a client of one server, a Sentinel client or a Cluster client, not a *redis.Ring", ErrInvalidOption)
		}
		cfg.coalesce = 0 // each decision waits for its own writes
	}
	return conn{client: client, cfg: cfg, outages: &ratelog.Every{}}, nil
}

// register records the limiter in the registry of names with its entry,
// unless a tool inspects its keys.
func (c *conn) register(entry keyspace.Entry) {
	if !c.cfg.inspecting {
		c.registry = newRegistration(c.cfg.prefix, c.cfg.name, entry)
	}
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
	c.noteUse()
	run := runScript
	if c.cfg.acks > 0 {
		run = func(ctx context.Context, _ redis.UniversalClient, script *redis.Script, keys []string, args []any) (reply, error) {
			return c.evalAcked(ctx, script, keys, args)
		}
	}
	if c.cfg.timeout <= 0 && ctx.Done() == nil {
		// Nothing to watch: the exchange runs on the caller's goroutine,
		// without the closure call needs.
		return run(ctx, c.client, script, keys, args)
	}
	var r reply
	err := c.call(ctx, func(ctx context.Context) error {
		var err error
		r, err = run(ctx, c.client, script, keys, args)
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
	values, err := runCmd(ctx, client, script, keys, args).Slice()
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

// call runs one Redis exchange under ctx and the configured timeout,
// through [bounded.Call]: the caller is answered by the time ctx ends or the
// timeout passes, whatever the client's options, while an abandoned
// exchange ends in the background within the client's ReadTimeout. When
// call returns an error fn may still be running, so the caller reads what fn
// writes only after call returned nil.
func (c *conn) call(ctx context.Context, fn func(context.Context) error) error {
	if c.cfg.timeout <= 0 {
		return bounded.Call(ctx, fn)
	}
	timed, cancel := context.WithTimeout(ctx, c.cfg.timeout)
	defer cancel()
	err := bounded.Call(timed, fn)
	if err != nil && ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) && (timed.Err() != nil || isTimeout(err)) {
		// The client reports the deadline as its own timeout (a net error,
		// possibly a moment before the context's timer fires): say which
		// deadline passed.
		err = fmt.Errorf("%w after %s: %w", context.DeadlineExceeded, c.cfg.timeout, err)
	}
	return err
}

// cleanup runs fn, which gives back what a caller took (a booking, a
// lease), through [bounded.Detached]: it is not cut short by ctx ending, and
// is bounded by the configured timeout, or by bounded.CleanupLimit without
// one; the caller waits for it only while ctx lives.
func (c *conn) cleanup(ctx context.Context, fn func(context.Context) error) error {
	limit := bounded.CleanupLimit
	if c.cfg.timeout > 0 {
		limit = c.cfg.timeout
	}
	return bounded.Detached(ctx, limit, fn)
}

// isTimeout reports a network timeout.
func isTimeout(err error) bool {
	var netErr net.Error
	return errors.As(err, &netErr) && netErr.Timeout()
}

// unavailable wraps a failed call: the caller's own context error when the
// caller gave up; ErrRefused with the cause for an answer of Redis that
// will not change by itself; ErrUnavailable with the cause otherwise.
func (c *conn) unavailable(ctx context.Context, err error) error {
	if redisclient.MovedOnPlainClient(c.client, err) {
		// A plain client on a node of a Redis Cluster: every key of
		// another node's slots is refused this way, which only a cluster
		// client mends.
		return fmt.Errorf("%w: %w (the server is a node of a Redis Cluster: give the limiter a *redis.ClusterClient, redis.NewClusterClient)", ErrRefused, err)
	}
	return redisFailure(ctx, err)
}

// redisFailure wraps a failed exchange with Redis, as conn.unavailable
// says. A caller whose context ended gets that context's error even when
// the exchange failed otherwise at the same moment (a connection refused as
// the deadline passed): it gave up, whatever Redis did.
func redisFailure(ctx context.Context, err error) error {
	if redisclient.Refused(err) {
		return fmt.Errorf("%w: %w", ErrRefused, err)
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("throttle: %w", ctxErr)
		}
		return fmt.Errorf("throttle: %w (as Redis failed: %w)", ctxErr, err)
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// failOpen reports whether a decision that failed with err is to be
// allowed: the failure policy says so, the caller has not given up, and the
// failure is one of reaching Redis in time, not a refusal.
func (c *conn) failOpen(ctx context.Context, err error) bool {
	return c.cfg.failure == FailOpen && ctx.Err() == nil && !redisclient.Refused(err) && !redisclient.MovedOnPlainClient(c.client, err)
}

// del deletes keys of one Cluster slot under the timeout.
func (c *conn) del(ctx context.Context, keys ...string) error {
	err := c.call(ctx, func(ctx context.Context) error { return c.client.Del(ctx, keys...).Err() })
	if err != nil {
		return c.unavailable(ctx, err)
	}
	return nil
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
