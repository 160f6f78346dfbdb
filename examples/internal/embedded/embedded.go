// Package embedded starts the in-process Redis (miniredis) the examples
// run on, so that they need nothing installed. In your code, connect to
// your Redis instead: redis.NewClient(&redis.Options{Addr: "redis:6379"}).
package embedded

import (
	"log"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Redis starts an embedded Redis and returns a client of it, and a
// function that stops both.
func Redis() (*redis.Client, func()) {
	mini := miniredis.NewMiniRedis()
	if err := mini.Start(); err != nil {
		log.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: mini.Addr()})
	return rdb, func() {
		rdb.Close()
		mini.Close()
	}
}
