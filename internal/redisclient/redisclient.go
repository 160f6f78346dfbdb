// Package redisclient holds what the library's packages check about the
// go-redis client a user hands them.
package redisclient

import (
	"errors"
	"reflect"
	"strings"

	"github.com/redis/go-redis/v9"
)

// IsNil reports whether c is nil, or a typed nil such as a (*redis.Client)(nil)
// stored in the interface, which would otherwise panic on first use.
func IsNil(c redis.UniversalClient) bool {
	if c == nil {
		return true
	}
	v := reflect.ValueOf(c)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// MovedOnPlainClient reports a MOVED or ASK answer (the key's slot is
// served by another node of a Redis Cluster) to a client that is not a
// *redis.ClusterClient: a plain client on a Cluster node, which only a
// cluster client mends.
func MovedOnPlainClient(c redis.UniversalClient, err error) bool {
	if _, cluster := c.(*redis.ClusterClient); cluster {
		return false
	}
	var answer redis.Error
	if !errors.As(err, &answer) {
		return false
	}
	msg := answer.Error()
	return strings.HasPrefix(msg, "MOVED ") || strings.HasPrefix(msg, "ASK ")
}

// Refused reports an error answer of Redis that will not go away by itself:
// a command Redis does not know or allow (a cluster client on a server
// without cluster support, an ACL without the permission, a missing AUTH, a
// key of another type, a script error). Answers that say "not now" (the
// server loading its data, busy with a script, a cluster or replica
// failing over, out of memory, out of clients) are not refusals: they are
// outages, which a limiter's failure policy covers. So are MOVED and ASK, which a
// cluster client hands back when a failover spent its redirects (on a
// plain client, MovedOnPlainClient tells them apart: only a cluster
// client mends them).
func Refused(err error) bool {
	var answer redis.Error
	if !errors.As(err, &answer) || errors.Is(err, redis.Nil) {
		return false
	}
	msg := answer.Error()
	for _, notNow := range transientAnswers {
		if strings.HasPrefix(msg, notNow) {
			return false
		}
	}
	return true
}

// transientAnswers start the error answers of Redis that end by themselves.
var transientAnswers = []string{
	"LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY",
	"NOREPLICAS", "OOM", "ERR max number of clients", "MOVED ", "ASK ",
}
