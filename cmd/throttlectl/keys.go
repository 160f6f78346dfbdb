package main

import (
	"errors"

	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	_ "github.com/jobthrottle/jobthrottle/throttle" // sets keyspace.Parse
)

// This file is the one place throttlectl reads the library's Redis keys
// back to limiter and caller key.

// keyInfo is what parseKey reads from a limiter's Redis key.
type keyInfo = keyspace.KeyInfo

// parseKey takes apart a Redis key a limiter under prefix wrote.
func parseKey(prefix, key string) (keyInfo, error) { return keyspace.Parse(prefix, key) }

// notLimiterKey reports a key no limiter writes (the worker's, the
// scheduler's), which a scan passes over.
func notLimiterKey(err error) bool { return errors.Is(err, keyspace.ErrNotLimiterKey) }
