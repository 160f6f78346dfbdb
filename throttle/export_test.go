package throttle

// ServerTime returns the Redis clock, in Unix microseconds, at which r was
// decided: tests feed it to the reference models.
func ServerTime(r Result) int64 { return r.serverTime }
