package throttle

import "strings"

// keyEscaper makes a caller key safe inside a Redis Cluster hash tag. It is
// injective: '%' is escaped too, so two distinct caller keys never map to
// the same Redis key, and no '{' or '}' survives to move the tag.
var keyEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

// redisKey returns prefix + policy id + ":{" + escaped caller key + "}". The
// braces are the hash tag: Redis Cluster places the key by the caller key
// alone, so every key of one caller key lives in one slot.
func redisKey(prefix, id, callerKey string) string {
	escaped := callerKey
	if strings.ContainsAny(callerKey, "%{}") {
		escaped = keyEscaper.Replace(callerKey)
	}
	return prefix + id + ":{" + escaped + "}"
}
