package throttle

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// WithReplicaAcks makes each decision of a Limiter wait, before it answers,
// until n replicas of the key's master have its writes, for up to timeout:
// Redis's WAIT, sent on the decision's connection in the same round trip.
// A master that fails over after answering then cannot lose an admission
// (see "What a promotion can lose" in docs/reliability.md). A decision that
// fewer than n replicas acknowledged in time is an outage: an error wrapping
// [ErrUnavailable], or an admission marked Degraded under [FailOpen]; its
// writes stay on the master. The price is a replica's round trip on every
// decision (measured in docs/reliability.md), and decisions are not
// coalesced. It applies to a Limiter's Allow, AllowN, AllowMany (one
// request at a time), Wait and Reserve, and to a ConcurrencyLimiter's
// Acquire, AcquireWait (the worker's caps too) and its leases' renewals
// and releases; the worker's bookings and waiting rooms do not wait. On a
// Redis Cluster the WAIT goes to the master of the key's slot; a
// *redis.Ring is refused. Default: off. n is 1 or more, timeout positive.
func WithReplicaAcks(n int, timeout time.Duration) Option {
	return optionFunc(func(c *config) error {
		if n < 1 {
			return fmt.Errorf("%w: replica acknowledgements must be 1 or more, got %d", ErrInvalidOption, n)
		}
		if timeout <= 0 {
			return fmt.Errorf("%w: the wait for replicas must be positive, got %s", ErrInvalidOption, timeout)
		}
		c.acks, c.acksTimeout = n, timeout
		return nil
	})
}

// ErrNotReplicated is wrapped, with ErrUnavailable, by the error of a
// decision that fewer replicas acknowledged than [WithReplicaAcks] asks.
var ErrNotReplicated = fmt.Errorf("%w: the decision's writes reached fewer replicas than asked", ErrUnavailable)

// evalAcked runs a script and WAIT on one connection to the master of its
// keys' slot, in one round trip, and returns the script's reply of
// integers once the replicas acknowledged it.
func (c *conn) evalAcked(ctx context.Context, script *redis.Script, keys []string, args []any) (reply, error) {
	values, err := c.evalAckedValues(ctx, script, keys, args)
	if err != nil {
		return reply{}, err
	}
	return replyFrom(values)
}

// evalAckedValues is evalAcked for a reply as it came, strings included.
func (c *conn) evalAckedValues(ctx context.Context, script *redis.Script, keys []string, args []any) ([]any, error) {
	var node redis.Cmdable = c.client
	if cluster, ok := c.client.(*redis.ClusterClient); ok {
		master, err := cluster.MasterForKey(ctx, keys[0])
		if err != nil {
			return nil, err
		}
		node = master
	}
	run := func(byText bool) (*redis.Cmd, *redis.Cmd, error) {
		var eval, wait *redis.Cmd
		_, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
			if byText {
				eval = script.Eval(ctx, p, keys, args...)
			} else {
				eval = script.EvalSha(ctx, p, keys, args...)
			}
			// WAIT counts in milliseconds, and 0 would wait for ever.
			wait = p.Do(ctx, "WAIT", c.cfg.acks, max(1, c.cfg.acksTimeout.Milliseconds()))
			return nil
		})
		return eval, wait, err
	}
	eval, wait, err := run(false)
	if redis.HasErrorPrefix(eval.Err(), "NOSCRIPT") {
		eval, wait, err = run(true)
	}
	if eval.Err() != nil {
		return nil, eval.Err()
	}
	if err != nil {
		return nil, err
	}
	values, err := eval.Slice()
	if err != nil {
		return nil, err
	}
	got, err := wait.Int64()
	if err != nil {
		return nil, err
	}
	if got < int64(c.cfg.acks) {
		return nil, fmt.Errorf("%w: %d of %d within %s", ErrNotReplicated, got, c.cfg.acks, c.cfg.acksTimeout)
	}
	return values, nil
}
