package throttle

import (
	"errors"
	"fmt"
)

// Errors returned by this package. Each is wrapped with detail, so test for
// them with [errors.Is]. Being throttled is never an error: it is a [Result]
// with Allowed false.
var (
	// ErrInvalidPolicy reports a policy that fails validation: a limit,
	// burst or rate below 1, a window shorter than a millisecond, or numbers
	// too large to compute exactly.
	ErrInvalidPolicy = errors.New("throttle: invalid policy")

	// ErrInvalidOption reports a bad option or a nil client given to a
	// constructor.
	ErrInvalidOption = errors.New("throttle: invalid option")

	// ErrInvalidKey reports an empty caller key.
	ErrInvalidKey = errors.New("throttle: invalid key")

	// ErrInvalidN reports a request for zero or fewer units.
	ErrInvalidN = errors.New("throttle: invalid n")

	// ErrExceedsLimit reports a request for more units than the policy can
	// ever admit at once (n above Limit, Burst or Capacity). Waiting would
	// not help, so no RetryAfter is given.
	ErrExceedsLimit = errors.New("throttle: request exceeds the policy's limit")

	// ErrInvalidDelay reports a negative longest delay given to Reserve.
	ErrInvalidDelay = errors.New("throttle: invalid delay")

	// ErrNotSupported reports an operation the policy does not offer, such
	// as Reserve on a window policy or a LeakyBucket.
	ErrNotSupported = errors.New("throttle: not supported by this policy")

	// ErrClosed reports a call on a Limiter after its Close.
	ErrClosed = errors.New("throttle: limiter closed")

	// ErrNotReserved reports waiting on a Reservation that was not booked.
	ErrNotReserved = errors.New("throttle: reservation not booked")

	// ErrLeaseLost reports a concurrency lease that had run out (its holder
	// stopped renewing it for a whole lease period) or was reset before it
	// was released.
	ErrLeaseLost = errors.New("throttle: lease lost")

	// ErrUnavailable reports that Redis could not decide in time: it was
	// unreachable, too slow for the configured timeout, or answered that it
	// cannot serve now (loading, busy, failing over, or a Cluster's MOVED or
	// ASK that a failover left a cluster client unable to follow). It wraps
	// the underlying cause. Under [FailOpen] the decision is allowed and
	// marked Degraded instead. A caller whose context ended gets that
	// context's error instead, under either policy.
	ErrUnavailable = errors.New("throttle: redis unavailable")

	// ErrRefused reports an answer of Redis that will not change by itself:
	// a command it does not know or allow, such as a ClusterClient talking
	// to a server without cluster support, a missing AUTH or ACL
	// permission, or a key of another type where the limiter keeps its
	// state. It wraps Redis's answer. It is returned under either failure
	// policy: FailOpen lets work through while Redis cannot be reached,
	// never past a configuration error.
	ErrRefused = errors.New("throttle: redis refused the command")
)

// invalidPolicy returns an error wrapping ErrInvalidPolicy.
func invalidPolicy(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidPolicy}, args...)...)
}
