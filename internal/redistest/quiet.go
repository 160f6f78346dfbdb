package redistest

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

var quiet sync.Once

// QuietRedisLog stops go-redis writing through its own global logger
// ("redis: connection pool: failed to dial after 5 attempts ..."), for
// tests that stop, pause or kill Redis on purpose, where those lines read
// like failures. It holds for the rest of the test binary: the logger is
// global to go-redis.
func QuietRedisLog() {
	quiet.Do(func() { redis.SetLogger(discardLogger{}) })
}

type discardLogger struct{}

func (discardLogger) Printf(context.Context, string, ...any) {}
