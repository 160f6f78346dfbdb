package main

import (
	"fmt"
	"os"

	"github.com/jobthrottle/jobthrottle/internal/redisaddr"
)

// This file reads where Redis is: --redis, else $REDIS_URL, else
// $REDIS_ADDR, else 127.0.0.1:6379; as host:port (comma-separated seeds
// with --cluster, Sentinels with --sentinel) or as a redis://, rediss://
// (TLS) or unix:// URL, which carries the ACL user, the password and the
// database number (package redisaddr reads it).

// defaultRedis is where Redis is looked for when nothing names it.
const defaultRedis = "127.0.0.1:6379"

// redisAddress is the --redis flag: its value and where the value came
// from, for messages. Its String hides a URL's password, so that -h and
// errors never print it.
type redisAddress struct {
	value string
	from  string // "--redis", "$REDIS_URL", "$REDIS_ADDR" or "default"
}

// redisFromEnv is the address the environment gives: $REDIS_URL, then
// $REDIS_ADDR (the variable throttlectl read first), then the default.
func redisFromEnv() redisAddress {
	for _, name := range []string{"REDIS_URL", "REDIS_ADDR"} {
		if v := os.Getenv(name); v != "" {
			return redisAddress{value: v, from: "$" + name}
		}
	}
	return redisAddress{value: defaultRedis, from: "default"}
}

func (r *redisAddress) String() string {
	if r == nil {
		return ""
	}
	return redisaddr.Redacted(r.value)
}

func (r *redisAddress) Set(v string) error {
	r.value, r.from = v, "--redis"
	return nil
}

// redisOptions reads the address into the options of a client: of one
// server, of a Cluster client with --cluster, of a Sentinel client with
// --sentinel. A timeout the URL does not set (dial_timeout, read_timeout,
// write_timeout) is --timeout.
func (g *globals) redisOptions() (redisaddr.Options, error) {
	spec := redisaddr.Spec{Value: g.redis.value, Cluster: g.cluster, Master: g.sentinel, Timeout: g.timeout}
	o, err := spec.Read()
	if err != nil {
		return redisaddr.Options{}, usageError{fmt.Errorf("%s %q: %w", g.redis.from, g.redis.String(), err)}
	}
	return o, nil
}
