package main

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redisaddr"
)

// TestRedisOptions reads --redis into client options: host:port, URLs with
// user, password, database, TLS and timeouts, and a Cluster's seeds.
func TestRedisOptions(t *testing.T) {
	for _, tc := range []struct {
		name     string
		value    string
		cluster  bool
		sentinel string
		addrs    string // comma-separated
		user     string
		password string
		db       int
		tls      string // the TLS server name; "" for none
		dial     time.Duration
	}{
		{"host:port", "127.0.0.1:6379", false, "", "127.0.0.1:6379", "", "", 0, "", 5 * time.Second},
		{"IPv6", "[::1]:6380", false, "", "[::1]:6380", "", "", 0, "", 5 * time.Second},
		{"URL", "redis://127.0.0.1:6379", false, "", "127.0.0.1:6379", "", "", 0, "", 5 * time.Second},
		{"URL without port", "redis://cache.internal", false, "", "cache.internal:6379", "", "", 0, "", 5 * time.Second},
		{"password and database", "redis://:s3cret@10.0.0.5:6380/3", false, "", "10.0.0.5:6380", "", "s3cret", 3, "", 5 * time.Second},
		{"ACL user", "redis://ops:p%40ss@10.0.0.5:6380/1", false, "", "10.0.0.5:6380", "ops", "p@ss", 1, "", 5 * time.Second},
		{"TLS", "rediss://ops:pw@redis.example.com:6380/2", false, "", "redis.example.com:6380", "ops", "pw", 2, "redis.example.com", 5 * time.Second},
		{"URL's own timeout", "redis://127.0.0.1:6379?dial_timeout=2s", false, "", "127.0.0.1:6379", "", "", 0, "", 2 * time.Second},
		{"seeds", "10.0.0.1:7000, 10.0.0.2:7000", true, "", "10.0.0.1:7000,10.0.0.2:7000", "", "", 0, "", 5 * time.Second},
		{"one seed", "10.0.0.1:7000", true, "", "10.0.0.1:7000", "", "", 0, "", 5 * time.Second},
		{"cluster URL", "redis://ops:pw@10.0.0.1:7000?addr=10.0.0.2:7000&addr=10.0.0.3:7000", true, "", "10.0.0.1:7000,10.0.0.2:7000,10.0.0.3:7000", "ops", "pw", 0, "", 5 * time.Second},
		{"cluster URL, TLS", "rediss://:pw@cluster.example.com:7000/0", true, "", "cluster.example.com:7000", "", "pw", 0, "cluster.example.com", 5 * time.Second},
		{"Sentinels", "10.0.0.1:26379, 10.0.0.2:26379", false, "mymaster", "10.0.0.1:26379,10.0.0.2:26379", "", "", 0, "", 5 * time.Second},
		{"Sentinel URL", "redis://:sentinelpw@10.0.0.1:26379/2?addr=10.0.0.2:26379&password=masterpw", false, "mymaster", "10.0.0.1:26379,10.0.0.2:26379", "", "masterpw", 2, "", 5 * time.Second},
		{"Sentinel URL naming the master", "redis://10.0.0.1:26379?master_name=mymaster", false, "mymaster", "10.0.0.1:26379", "", "", 0, "", 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := globals{redis: redisAddress{value: tc.value, from: "--redis"}, cluster: tc.cluster, sentinel: tc.sentinel, timeout: 5 * time.Second}
			o, err := g.redisOptions()
			if err != nil {
				t.Fatal(err)
			}
			var addrs []string
			var user, password, tls string
			var db int
			var dial, read time.Duration
			var contextTimeouts bool
			switch {
			case tc.cluster:
				if o.Cluster == nil {
					t.Fatalf("--cluster gave %+v", o)
				}
				c := o.Cluster
				addrs, user, password, dial, read, contextTimeouts = c.Addrs, c.Username, c.Password, c.DialTimeout, c.ReadTimeout, c.ContextTimeoutEnabled
				if c.TLSConfig != nil {
					tls = c.TLSConfig.ServerName
				}
			case tc.sentinel != "":
				if o.Sentinel == nil {
					t.Fatalf("--sentinel gave %+v", o)
				}
				f := o.Sentinel
				if f.MasterName != tc.sentinel {
					t.Errorf("master %q, want %q", f.MasterName, tc.sentinel)
				}
				addrs, user, password, db, dial, read, contextTimeouts = f.SentinelAddrs, f.Username, f.Password, f.DB, f.DialTimeout, f.ReadTimeout, f.ContextTimeoutEnabled
			default:
				if o.Server == nil {
					t.Fatalf("no --cluster gave %+v", o)
				}
				c := o.Server
				addrs, user, password, db, dial, read, contextTimeouts = []string{c.Addr}, c.Username, c.Password, c.DB, c.DialTimeout, c.ReadTimeout, c.ContextTimeoutEnabled
				if c.TLSConfig != nil {
					tls = c.TLSConfig.ServerName
				}
			}
			if got := strings.Join(addrs, ","); got != tc.addrs || user != tc.user || password != tc.password || db != tc.db || tls != tc.tls {
				t.Errorf("addrs %s, user %q, password %q, db %d, TLS %q; want %s, %q, %q, %d, %q", got, user, password, db, tls, tc.addrs, tc.user, tc.password, tc.db, tc.tls)
			}
			if dial != tc.dial || read != 5*time.Second || !contextTimeouts {
				t.Errorf("timeouts: dial %s, read %s, context %t", dial, read, contextTimeouts)
			}
		})
	}
}

// TestRedisOptionsRefused: a bad address is a usage error that names the
// address without its password and wraps the cause.
func TestRedisOptionsRefused(t *testing.T) {
	for _, tc := range []struct {
		value    string
		cluster  bool
		sentinel string
		says     string
		cause    any // a pointer to the type of error wrapped, or nil
	}{
		{"localhost", false, "", `--redis "localhost": want host:port or a redis:// URL: address localhost: missing port in address`, new(*net.AddrError)},
		{"localhost:0", false, "", `bad port "0"`, nil},
		{"redis://ops:s3cret@host:port/1", false, "", `--redis "redis://ops:xxxxx@host:port/1": bad URL: invalid port ":port" after host`, nil},
		{"redis://:s3cret@host:6379/one", false, "", `invalid database number: "one"`, nil},
		{"ftp://host:21", false, "", "invalid URL scheme: ftp", nil},
		{"redis://a:1,b:2", false, "", "needs --cluster", nil},
		{"a:1,b:2", false, "", "needs --cluster", nil},
		{"a:1,b", true, "", `seed "b": want host:port`, new(*net.AddrError)},
		{"redis://:s3cret@a:1/4", true, "", "only database 0", nil},
		{"unix:///tmp/redis.sock", true, "", "invalid URL scheme: unix", nil},
		{" ", false, "", "is empty", nil},
		{"a:1,b:2", true, "m", "not both", nil},
		{"a:1,b", false, "m", `Sentinel "b": want host:port`, new(*net.AddrError)},
		{"redis://:s3cret@a:1?master_name=other&password=s3cret", false, "m", `names master "other"`, nil},
		{"redis://a:1,b:2", false, "m", "one URL", nil},
	} {
		g := globals{redis: redisAddress{value: tc.value, from: "--redis"}, cluster: tc.cluster, sentinel: tc.sentinel, timeout: time.Second}
		_, err := g.redisOptions()
		switch {
		case err == nil:
			t.Errorf("%q: no error", tc.value)
		case !errors.As(err, new(usageError)):
			t.Errorf("%q: %v is not a usage error", tc.value, err)
		case !strings.Contains(err.Error(), tc.says):
			t.Errorf("%q: error %q does not say %q", tc.value, err, tc.says)
		case strings.Contains(err.Error(), "s3cret"):
			t.Errorf("%q: error %q shows the password", tc.value, err)
		case tc.cause != nil && !errors.As(err, tc.cause):
			t.Errorf("%q: error %q does not wrap a %T", tc.value, err, tc.cause)
		}
	}
}

// TestRedisFromEnv: $REDIS_URL, then $REDIS_ADDR, then the default; the
// flag's text never shows a password.
func TestRedisFromEnv(t *testing.T) {
	for _, tc := range []struct {
		url, addr string
		want      redisAddress
		shown     string
	}{
		{"", "", redisAddress{defaultRedis, "default"}, defaultRedis},
		{"", "10.0.0.1:6379", redisAddress{"10.0.0.1:6379", "$REDIS_ADDR"}, "10.0.0.1:6379"},
		{"redis://:pw@10.0.0.2:6379/1", "10.0.0.1:6379", redisAddress{"redis://:pw@10.0.0.2:6379/1", "$REDIS_URL"}, "redis://:xxxxx@10.0.0.2:6379/1"},
	} {
		t.Setenv("REDIS_URL", tc.url)
		t.Setenv("REDIS_ADDR", tc.addr)
		got := redisFromEnv()
		if got != tc.want || got.String() != tc.shown {
			t.Errorf("REDIS_URL=%q REDIS_ADDR=%q: %+v shown %q, want %+v shown %q", tc.url, tc.addr, got, got.String(), tc.want, tc.shown)
		}
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:6379":                      "127.0.0.1:6379",
		"redis://host:6379/2":                 "redis://host:6379/2",
		"redis://ops@host:6379":               "redis://ops@host:6379",
		"redis://ops:pw@host:6379/2":          "redis://ops:xxxxx@host:6379/2",
		"rediss://:p@ss:w@rd@host:bad/2":      "rediss://:xxxxx@host:bad/2",
		"redis://:pw@h:1?addr=h2:1&db=1":      "redis://:xxxxx@h:1?addr=h2:1&db=1",
		"redis://h:1?password=pw&addr=h2:1":   "redis://h:1?password=xxxxx&addr=h2:1",
		"redis://u:a@h:1?sentinel_password=b": "redis://u:xxxxx@h:1?sentinel_password=xxxxx",
	} {
		if got := redisaddr.Redacted(in); got != want {
			t.Errorf("redact(%q) = %q, want %q", in, got, want)
		}
	}
}
