// Package redisclient holds what the library's packages check about the
// go-redis client a user hands them.
package redisclient

import (
	"reflect"

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
