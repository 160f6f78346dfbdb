package throttle

import "strings"

// keyEscaper makes a caller key safe inside a Redis Cluster hash tag. It is
// injective: '%' is escaped too, so two distinct caller keys never map to
// the same Redis key, and no '{' or '}' survives to move the tag.
var keyEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

// Tag returns s as a Redis Cluster hash tag, "{" + s + "}", with '{', '}'
// and '%' escaped so that nothing in s can move the tag or make two
// strings share one. Packages that keep their own keys beside a Limiter's
// use it to place them.
func Tag(s string) string {
	if strings.ContainsAny(s, "%{}") {
		s = keyEscaper.Replace(s)
	}
	return "{" + s + "}"
}

// redisKey returns prefix + policy id + ":{" + escaped caller key + "}". The
// braces are the hash tag: Redis Cluster places the key by the caller key
// alone, so every key of one caller key lives in one slot.
func redisKey(prefix, id, callerKey string) string {
	return redisKeyWith(prefix, id, callerKey, "")
}

// redisKeyWith is redisKey followed by suffix, built in one allocation.
func redisKeyWith(prefix, id, callerKey, suffix string) string {
	if strings.ContainsAny(callerKey, "%{}") {
		callerKey = keyEscaper.Replace(callerKey)
	}
	return prefix + id + ":{" + callerKey + "}" + suffix
}

// ticketKey returns the key of a caller's ticket beside a state key: in the
// same hash tag, so in the same Cluster slot. The ticket is escaped like a
// caller key.
func ticketKey(stateKey, ticket string) string {
	if strings.ContainsAny(ticket, "%{}") {
		ticket = keyEscaper.Replace(ticket)
	}
	return stateKey + ":t:" + ticket
}

// blockSuffix turns a state key into the key of its block (see BlockFor),
// in the same Cluster slot.
const blockSuffix = ":block"

func blockKey(stateKey string) string { return stateKey + blockSuffix }
