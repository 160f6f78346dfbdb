package keyspace

import (
	"fmt"
	"strings"
)

// HashTag returns the part of key that Redis Cluster places it by: the text
// between its first '{' and the first '}' after that, when not empty, else
// the whole key (the rule of the Redis Cluster specification). Two keys
// with the same HashTag are in one slot.
func HashTag(key string) string {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return key
	}
	length := strings.IndexByte(key[open+1:], '}')
	if length <= 0 {
		return key
	}
	return key[open+1 : open+1+length]
}

// OneSlot reports whether every key is in one Redis Cluster slot because
// they share a hash tag (or are one key). It does not compute slots: keys
// of different tags that happen to share a slot are reported false.
func OneSlot(keys ...string) bool {
	for _, k := range keys[min(1, len(keys)):] {
		if HashTag(k) != HashTag(keys[0]) {
			return false
		}
	}
	return true
}

// CheckPrefix reports what is wrong with a key prefix: a prefix holds no
// '{' or '}', or exactly one hash tag, "{" + a non-empty name without
// braces + "}", which puts every key under the prefix in the one Redis
// Cluster slot of that name ("throttle:{jobs}:"). The error is plain;
// callers wrap it in their ErrInvalidOption.
func CheckPrefix(prefix string) error {
	open, closing := strings.IndexByte(prefix, '{'), strings.IndexByte(prefix, '}')
	if open < 0 && closing < 0 {
		return nil
	}
	if open < 0 || closing < open+2 || strings.Count(prefix, "{") > 1 || strings.Count(prefix, "}") > 1 {
		return fmt.Errorf("prefix %q: a prefix holds no '{' or '}', or one hash tag such as \"throttle:{jobs}:\" (a name between one '{' and one '}') to keep every key in one Redis Cluster slot", prefix)
	}
	return nil
}
