package throttle

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/jobthrottle/jobthrottle/internal/keyspace"
)

// redisKey returns prefix + policy id + ":{" + the caller key's stored form
// + "}". The braces are the hash tag: Redis Cluster places the key by the
// caller key alone, so every key of one caller key lives in one slot.
func (c *config) redisKey(id, callerKey string) string {
	return c.redisKeyWith(id, callerKey, "")
}

// redisKeyWith is redisKey followed by suffix, built in one allocation.
func (c *config) redisKeyWith(id, callerKey, suffix string) string {
	return c.prefix + id + ":{" + c.stored(callerKey) + "}" + suffix
}

// ticketKey returns the key of a caller's ticket beside a state key: in the
// same hash tag, so in the same Cluster slot. The ticket is escaped like a
// caller key.
func ticketKey(stateKey, ticket string) string {
	return stateKey + keyspace.TicketInfix + keyspace.Escape(ticket)
}

func blockKey(stateKey string) string { return stateKey + keyspace.BlockSuffix }

// stored returns the form of callerKey that goes into Redis keys: escaped,
// or hashed when it is longer than WithKeyHashing's bound.
func (c *config) stored(callerKey string) string {
	if c.hashOver < 0 || len(callerKey) <= c.hashOver {
		return keyspace.Escape(callerKey)
	}
	sum := sha256.Sum256([]byte(callerKey))
	return keyspace.HashedMark + hex.EncodeToString(sum[:])
}
