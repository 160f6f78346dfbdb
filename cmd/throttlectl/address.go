package main

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// This file reads where Redis is: --redis, else $REDIS_URL, else
// $REDIS_ADDR, else 127.0.0.1:6379; as host:port (comma-separated seeds
// with --cluster) or as a redis://, rediss:// (TLS) or unix:// URL, which
// carries the ACL user, the password and the database number.

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
	return redact(r.value)
}

func (r *redisAddress) Set(v string) error {
	r.value, r.from = v, "--redis"
	return nil
}

// isURL reports an address written as a URL rather than host:port.
func isURL(s string) bool { return strings.Contains(s, "://") }

// redact hides the password of a URL's user info: "redis://u:xxxxx@h".
// It works on the text, so that it also hides the password of a URL that
// does not parse.
func redact(s string) string {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return s
	}
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		return s
	}
	user, _, hasPassword := strings.Cut(rest[:at], ":")
	if !hasPassword {
		return s
	}
	return scheme + "://" + user + ":xxxxx" + rest[at:]
}

// redisOptions reads the address into the options of a client, or of a
// Cluster client with --cluster (the other is nil). A timeout the URL does
// not set (dial_timeout, read_timeout, write_timeout) is --timeout.
func (g *globals) redisOptions() (*redis.Options, *redis.ClusterOptions, error) {
	value := strings.TrimSpace(g.redis.value)
	if value == "" {
		return nil, nil, usagef("%s is empty: want host:port or a redis:// URL", g.redis.from)
	}
	if g.cluster {
		o, err := clusterOptions(value)
		if err != nil {
			return nil, nil, usageError{fmt.Errorf("%s %q: %w", g.redis.from, redact(value), err)}
		}
		o.DialTimeout = orTimeout(o.DialTimeout, g.timeout)
		o.ReadTimeout = orTimeout(o.ReadTimeout, g.timeout)
		o.WriteTimeout = orTimeout(o.WriteTimeout, g.timeout)
		o.ContextTimeoutEnabled = true
		return nil, o, nil
	}
	o, err := serverOptions(value)
	if err != nil {
		return nil, nil, usageError{fmt.Errorf("%s %q: %w", g.redis.from, redact(value), err)}
	}
	o.DialTimeout = orTimeout(o.DialTimeout, g.timeout)
	o.ReadTimeout = orTimeout(o.ReadTimeout, g.timeout)
	o.WriteTimeout = orTimeout(o.WriteTimeout, g.timeout)
	o.ContextTimeoutEnabled = true
	return o, nil, nil
}

// orTimeout is a URL's timeout, or timeout when the URL left it out (0);
// a negative one (no timeout) stays.
func orTimeout(fromURL, timeout time.Duration) time.Duration {
	if fromURL == 0 {
		return timeout
	}
	return fromURL
}

// serverOptions reads one server's address: host:port or a URL.
func serverOptions(value string) (*redis.Options, error) {
	if strings.Contains(value, ",") {
		return nil, errors.New("a comma-separated list of seeds needs --cluster")
	}
	if !isURL(value) {
		addr, err := hostPort(value)
		if err != nil {
			return nil, err
		}
		return &redis.Options{Addr: addr}, nil
	}
	o, err := redis.ParseURL(value)
	if err != nil {
		return nil, urlError(err)
	}
	return o, nil
}

// clusterOptions reads a Cluster's seeds: host:port seeds separated by
// commas, or one URL with more seeds as ?addr=host:port parameters.
func clusterOptions(value string) (*redis.ClusterOptions, error) {
	if !isURL(value) {
		var addrs []string
		for _, seed := range strings.Split(value, ",") {
			addr, err := hostPort(strings.TrimSpace(seed))
			if err != nil {
				return nil, fmt.Errorf("seed %q: %w", strings.TrimSpace(seed), err)
			}
			addrs = append(addrs, addr)
		}
		return &redis.ClusterOptions{Addrs: addrs}, nil
	}
	if strings.Contains(value, ",") {
		return nil, errors.New("give a Cluster one URL, with more seeds as ?addr=host:port, or host:port seeds separated by commas")
	}
	o, err := redis.ParseClusterURL(value)
	if err != nil {
		return nil, urlError(err)
	}
	// ParseClusterURL passes over the path, where a database would be.
	u, err := url.Parse(value)
	if err != nil {
		return nil, urlError(err)
	}
	if db := strings.Trim(u.Path, "/"); db != "" && db != "0" {
		return nil, fmt.Errorf("a Redis Cluster has only database 0, the URL names %q", db)
	}
	return o, nil
}

// hostPort checks an address written host:port.
func hostPort(addr string) (string, error) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("want host:port or a redis:// URL: %w", err)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return "", fmt.Errorf("bad port %q: want 1 to 65535", port)
	}
	return addr, nil
}

// urlError is go-redis's error about a URL, without the URL itself, which
// url.Parse puts in its errors password and all: the caller names the
// address, redacted.
func urlError(err error) error {
	var parse *url.Error
	if errors.As(err, &parse) {
		return fmt.Errorf("bad URL: %w", parse.Err)
	}
	return fmt.Errorf("bad URL: %w", err)
}
