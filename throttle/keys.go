package throttle

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// keyEscaper makes a caller key safe inside a Redis Cluster hash tag. It is
// injective: '%' is escaped too, so two distinct caller keys never map to
// the same Redis key, and no '{' or '}' survives to move the tag.
var keyEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

// Tag returns s as a Redis Cluster hash tag, "{" + s + "}", with '{', '}'
// and '%' escaped so that nothing in s can move the tag or make two
// strings share one. Packages that keep their own keys beside a Limiter's
// use it to place them.
func Tag(s string) string {
	return "{" + escape(s) + "}"
}

// escape returns s with '%', '{' and '}' escaped, without copying a string
// that has none.
func escape(s string) string {
	if strings.ContainsAny(s, "%{}") {
		return keyEscaper.Replace(s)
	}
	return s
}

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
	return stateKey + ":t:" + escape(ticket)
}

// ticketsSuffix turns a state key into the key of its tickets' generation
// (see common.lua): deleting it forgets every ticket of the caller key.
const ticketsSuffix = ":tickets"

// blockSuffix turns a state key into the key of its block (see BlockFor),
// in the same Cluster slot.
const blockSuffix = ":block"

func blockKey(stateKey string) string { return stateKey + blockSuffix }

// hashedKeyMark starts a hashed caller key. An escaped caller key never
// contains it ('%' is always escaped to "%25"), so a hashed key and a
// caller key given as is never meet.
const hashedKeyMark = "%#"

// HashedKeyLen is the length of a caller key hashed by [WithKeyHashing]:
// the mark and the hex SHA-256 of the key.
const HashedKeyLen = len(hashedKeyMark) + 2*sha256.Size

// stored returns the form of callerKey that goes into Redis keys: escaped,
// or hashed when it is longer than WithKeyHashing's bound.
func (c *config) stored(callerKey string) string {
	if c.hashOver < 0 || len(callerKey) <= c.hashOver {
		return escape(callerKey)
	}
	sum := sha256.Sum256([]byte(callerKey))
	return hashedKeyMark + hex.EncodeToString(sum[:])
}
