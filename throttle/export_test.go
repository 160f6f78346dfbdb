package throttle

// ServerTime returns the Redis clock, in Unix microseconds, at which r was
// decided: tests feed it to the reference models.
func ServerTime(r Result) int64 { return r.serverTime }

// ServerStart returns a booked reservation's start on the Redis clock, in
// Unix microseconds.
func ServerStart(r *Reservation) int64 { return r.serverStart }

// AbandonLease stops a lease's renewals without releasing it: the holder
// "crashes".
func AbandonLease(l *Lease) { l.stopRenewing() }
