package throttle

import (
	"github.com/jobthrottle/jobthrottle/internal/scripts"
	"github.com/jobthrottle/jobthrottle/lua"
	"github.com/redis/go-redis/v9"
)

// limiterScript returns the limiters' script name.lua as Redis runs it
// (lua/assembled/).
func limiterScript(name string) *redis.Script {
	return scripts.Load(lua.Scripts, "assembled/"+name+".lua")
}
