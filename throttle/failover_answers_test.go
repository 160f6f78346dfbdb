package throttle_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// answer is an error answer of Redis, as go-redis hands one back.
type answer string

func (a answer) Error() string { return string(a) }
func (answer) RedisError()     {}

// answerHook fails every command with err, as a cluster client does when
// a failover spent its redirects; before failing it calls before, if set.
type answerHook struct {
	err    error
	before func()
}

func (h answerHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h answerHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.before != nil {
			h.before()
		}
		cmd.SetErr(h.err)
		return h.err
	}
}
func (h answerHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestRedirectsOfAFailoverAreOutages: a cluster client hands MOVED or ASK
// back when a failover spent its redirects (connection retries to a dead
// master count against them). That is an outage, which the failure policy
// covers: fail-closed returns ErrUnavailable, fail-open a degraded
// admission; never ErrRefused, which says the set-up is wrong. (A plain
// client on a Cluster node is still refused MOVED: see
// TestAPlainClientOnAClusterNodeIsToldToUseAClusterClient.)
func TestRedirectsOfAFailoverAreOutages(t *testing.T) {
	tg := redistest.Embedded(t)
	policy := throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1}
	for _, redirect := range []string{"MOVED 866 127.0.0.1:7001", "ASK 866 127.0.0.1:7001"} {
		t.Run(strings.Fields(redirect)[0], func(t *testing.T) {
			client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{tg.Mini.Addr()}})
			t.Cleanup(func() { _ = client.Close() })
			client.AddHook(answerHook{err: answer(redirect)})
			for _, failure := range []throttle.FailurePolicy{throttle.FailClosed, throttle.FailOpen} {
				l, err := throttle.New(client, fmt.Sprint("redirect-", failure), policy, throttle.WithFailurePolicy(failure), throttle.WithLogger(nil))
				if err != nil {
					t.Fatal(err)
				}
				r, err := l.Allow(context.Background(), "k")
				switch {
				case errors.Is(err, throttle.ErrRefused):
					t.Fatalf("%s: %v; a failover's redirect is an outage, not ErrRefused", failure, err)
				case failure == throttle.FailClosed && (!errors.Is(err, throttle.ErrUnavailable) || r.Allowed):
					t.Fatalf("%s: %+v, %v; want ErrUnavailable", failure, r, err)
				case failure == throttle.FailOpen && (err != nil || !r.Degraded):
					t.Fatalf("%s: %+v, %v; want a degraded admission", failure, r, err)
				}
			}
		})
	}
}

// TestAFailOpenCallerThatGaveUpGetsItsContextsError: when a fail-open
// caller's context ends as the connection fails (the failure answered at
// the same moment), the call returns the context's error, as the docs
// promise, never ErrUnavailable or a degraded admission. The hook cancels
// the caller's context and then fails the command; each of the 200 calls
// sees both at once.
func TestAFailOpenCallerThatGaveUpGetsItsContextsError(t *testing.T) {
	tg := redistest.Embedded(t)
	// The limiter's own background calls (its registration) go through
	// the hook too, so the current call's cancel is shared safely.
	var current atomic.Pointer[context.CancelFunc]
	client := tg.NewClient(t)
	refusedConn := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	client.AddHook(answerHook{err: refusedConn, before: func() {
		if cancel := current.Load(); cancel != nil {
			(*cancel)()
		}
	}})
	l, err := throttle.New(client, "open", throttle.GCRA{Rate: throttle.PerSecond(10), Burst: 1},
		throttle.WithFailurePolicy(throttle.FailOpen), throttle.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		ctx, cancel := context.WithCancel(context.Background())
		current.Store(&cancel)
		r, err := l.Allow(ctx, "k")
		if !errors.Is(err, context.Canceled) || errors.Is(err, throttle.ErrUnavailable) || r.Allowed || r.Degraded {
			t.Fatalf("call %d: %+v, %v; want the caller's context.Canceled", i, r, err)
		}
	}
}
