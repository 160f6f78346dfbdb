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
