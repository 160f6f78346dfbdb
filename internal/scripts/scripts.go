// Package scripts loads jobthrottle's assembled Lua scripts (see package
// lua and internal/luagen) as go-redis scripts.
package scripts

import (
	"io/fs"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// Load returns the script at path in fsys, ready to run with EVALSHA. A
// file missing from the build cannot happen while the package's tests
// pass; were it so, every call of the script fails with a Redis error
// naming the file, rather than the program panicking at start.
func Load(fsys fs.FS, path string) *redis.Script {
	text, err := fs.ReadFile(fsys, path)
	if err != nil {
		return redis.NewScript("return redis.error_reply(" + strconv.Quote("jobthrottle: script "+path+" is missing from this build") + ")")
	}
	return redis.NewScript(string(text))
}
