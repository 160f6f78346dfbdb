// Package redisaddr reads where the commands' Redis is, as an operator
// writes it: one server, the seeds of a Redis Cluster, or the Sentinels of
// a master, each as host:port or as a redis://, rediss:// (TLS) or unix://
// URL, and opens a go-redis client on it.
package redisaddr

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Spec is where Redis is.
type Spec struct {
	// Value is host:port, host:port seeds (or Sentinels) separated by
	// commas, or one URL.
	Value string
	// Cluster says Value names seeds of a Redis Cluster.
	Cluster bool
	// Master, when set, says Value names Sentinels, which know the master
	// by this name.
	Master string
	// Timeout is the dial, read and write timeout of the client where a
	// URL does not set one.
	Timeout time.Duration
}

// Options are a client's options: exactly one is set.
type Options struct {
	Server   *redis.Options
	Cluster  *redis.ClusterOptions
	Sentinel *redis.FailoverOptions
}

// Kind names the topology, for messages: "Redis", "Redis Cluster" or
// "Redis behind Sentinel".
func (o Options) Kind() string {
	switch {
	case o.Cluster != nil:
		return "Redis Cluster"
	case o.Sentinel != nil:
		return "Redis behind Sentinel"
	}
	return "Redis"
}

// NewClient opens a client with the options.
func (o Options) NewClient() redis.UniversalClient {
	switch {
	case o.Cluster != nil:
		return redis.NewClusterClient(o.Cluster)
	case o.Sentinel != nil:
		return redis.NewFailoverClient(o.Sentinel)
	}
	return redis.NewClient(o.Server)
}

// Read reads a Spec into a client's options, with context timeouts on.
// Its errors do not show the value: the caller names it, Redacted.
func (s Spec) Read() (Options, error) {
	value := strings.TrimSpace(s.Value)
	if value == "" {
		return Options{}, errors.New("is empty: want host:port or a redis:// URL")
	}
	switch {
	case s.Cluster && s.Master != "":
		return Options{}, errors.New("a Redis Cluster has no Sentinels: give a Cluster's seeds or a master's Sentinels, not both")
	case s.Cluster:
		o, err := clusterOptions(value)
		if err != nil {
			return Options{}, err
		}
		s.timeouts(&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.ContextTimeoutEnabled)
		return Options{Cluster: o}, nil
	case s.Master != "":
		o, err := sentinelOptions(value, s.Master)
		if err != nil {
			return Options{}, err
		}
		s.timeouts(&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.ContextTimeoutEnabled)
		return Options{Sentinel: o}, nil
	}
	o, err := serverOptions(value)
	if err != nil {
		return Options{}, err
	}
	s.timeouts(&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.ContextTimeoutEnabled)
	return Options{Server: o}, nil
}

// timeouts sets a client's dial, read and write timeouts that its URL left
// out to s.Timeout, and turns its context timeouts on: the fields of any of
// go-redis's three option types.
func (s Spec) timeouts(dial, read, write *time.Duration, contextTimeouts *bool) {
	for _, d := range []*time.Duration{dial, read, write} {
		*d = orTimeout(*d, s.Timeout)
	}
	*contextTimeouts = true
}

// orTimeout is a URL's timeout, or timeout when the URL left it out (0);
// a negative one (no timeout) stays.
func orTimeout(fromURL, timeout time.Duration) time.Duration {
	if fromURL == 0 {
		return timeout
	}
	return fromURL
}

// IsURL reports an address written as a URL rather than host:port.
func IsURL(s string) bool { return strings.Contains(s, "://") }

// Redacted hides the passwords of a URL, in its user info and in a
// password parameter: "redis://u:xxxxx@h?password=xxxxx". It works on the
// text, so that it also hides the password of a URL that does not parse.
func Redacted(s string) string {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return s
	}
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		if user, _, hasPassword := strings.Cut(rest[:at], ":"); hasPassword {
			rest = user + ":xxxxx" + rest[at:]
		}
	}
	if base, query, ok := strings.Cut(rest, "?"); ok {
		params := strings.Split(query, "&")
		for i, p := range params {
			if name, _, ok := strings.Cut(p, "="); ok && (name == "password" || name == "sentinel_password") {
				params[i] = name + "=xxxxx"
			}
		}
		rest = base + "?" + strings.Join(params, "&")
	}
	return scheme + "://" + rest
}

// serverOptions reads one server's address: host:port or a URL.
func serverOptions(value string) (*redis.Options, error) {
	if strings.Contains(value, ",") {
		return nil, errors.New("a comma-separated list of seeds needs --cluster (or --sentinel for Sentinels)")
	}
	if !IsURL(value) {
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
	if !IsURL(value) {
		addrs, err := hostPorts(value, "seed")
		if err != nil {
			return nil, err
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

// sentinelOptions reads the Sentinels of the master named master:
// host:port Sentinels separated by commas, or one URL with more Sentinels
// as ?addr=host:port parameters (go-redis's ParseFailoverURL: the URL's
// user and password are the Sentinels', the master's are the username and
// password parameters, the path is the database).
func sentinelOptions(value, master string) (*redis.FailoverOptions, error) {
	if !IsURL(value) {
		addrs, err := hostPorts(value, "Sentinel")
		if err != nil {
			return nil, err
		}
		return &redis.FailoverOptions{MasterName: master, SentinelAddrs: addrs}, nil
	}
	if strings.Contains(value, ",") {
		return nil, errors.New("give the Sentinels one URL, with more Sentinels as ?addr=host:port, or host:port Sentinels separated by commas")
	}
	o, err := redis.ParseFailoverURL(value)
	if err != nil {
		return nil, urlError(err)
	}
	if o.MasterName != "" && o.MasterName != master {
		return nil, fmt.Errorf("the URL names master %q, --sentinel %q", o.MasterName, master)
	}
	o.MasterName = master
	return o, nil
}

// hostPorts reads host:port addresses separated by commas.
func hostPorts(value, what string) ([]string, error) {
	var addrs []string
	for _, a := range strings.Split(value, ",") {
		addr, err := hostPort(strings.TrimSpace(a))
		if err != nil {
			return nil, fmt.Errorf("%s %q: %w", what, strings.TrimSpace(a), err)
		}
		addrs = append(addrs, addr)
	}
	return addrs, nil
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
