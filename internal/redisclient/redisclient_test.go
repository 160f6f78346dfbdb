package redisclient

import (
	"errors"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"
)

// answer is an answer of Redis, as go-redis returns one (redis.Error).
type answer string

func (a answer) Error() string { return string(a) }
func (a answer) RedisError()   {}

func TestMovedOnPlainClient(t *testing.T) {
	plain := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	t.Cleanup(func() { plain.Close(); cluster.Close() })
	moved := fmt.Errorf("running a script: %w", answer("MOVED 11327 127.0.0.1:7001"))
	for _, c := range []struct {
		client redis.UniversalClient
		err    error
		want   bool
	}{
		{plain, moved, true},
		{plain, answer("ASK 11327 127.0.0.1:7001"), true},
		{cluster, moved, false},
		{plain, answer("ERR unknown command"), false},
		{plain, errors.New("MOVED 1 h:1"), false}, // not an answer of Redis
		{plain, nil, false},
	} {
		if got := MovedOnPlainClient(c.client, c.err); got != c.want {
			t.Errorf("MovedOnPlainClient(%T, %v) = %v, want %v", c.client, c.err, got, c.want)
		}
	}
}
