package fleet

// Counts are the decisions of one second.
type Counts struct {
	Admitted, Throttled, Rescheduled int64
}

// Second is the counts of one second, by its Unix time on the Redis clock.
type Second struct {
	Unix int64
	Counts
}

// Add adds c into the second of seconds whose Unix time is unix, appending
// it when missing, and returns the slice. The last second is looked at
// first: counts arrive in time order.
func Add(seconds []Second, unix int64, c Counts) []Second {
	for i := len(seconds) - 1; i >= 0; i-- {
		if seconds[i].Unix == unix {
			s := &seconds[i]
			s.Admitted += c.Admitted
			s.Throttled += c.Throttled
			s.Rescheduled += c.Rescheduled
			return seconds
		}
	}
	return append(seconds, Second{Unix: unix, Counts: c})
}

// Caller is what a batch holds for one caller key.
type Caller struct {
	Seconds []Second
	// Policy and Source are the last policy seen in force for the key and
	// where it came from, when not the code's; empty otherwise.
	Policy, Source string
}

// LimiterBatch is what a batch holds for one limiter.
type LimiterBatch struct {
	// Kind is "rate" or "concurrency"; empty when not known (the worker's
	// events alone), which keeps the kind stored.
	Kind string
	// CodePolicy is the policy in code, empty when not seen.
	CodePolicy string
	// Seconds are the limiter's totals, every key's included.
	Seconds []Second
	// Callers are the counts of the keys tracked.
	Callers map[string]*Caller
}

// Batch is one flush: a process's counts since its last successful flush.
type Batch struct {
	// Process names the writer in the processes' set.
	Process  string
	Limiters map[string]*LimiterBatch
}

// Bounds limit what Merge keeps.
type Bounds struct {
	// Limiters is the most limiters kept.
	Limiters int
	// KeysPerLimiter is the most caller keys kept per limiter.
	KeysPerLimiter int
	// KeySeconds is the most seconds kept over every caller key; beyond
	// it a key's seconds are dropped, the limiter's totals kept.
	KeySeconds int
}

// Merge adds the counts of from into into, within bounds, and returns how
// many limiters' counts it dropped. A caller key beyond the bounds loses its
// own counts only: they are already in its limiter's totals.
func Merge(into, from map[string]*LimiterBatch, bounds Bounds) (dropped int) {
	cells := 0
	for _, l := range into {
		for _, c := range l.Callers {
			cells += len(c.Seconds)
		}
	}
	for name, l := range from {
		dst := into[name]
		if dst == nil {
			if len(into) >= bounds.Limiters {
				dropped++
				continue
			}
			dst = &LimiterBatch{Callers: map[string]*Caller{}}
			into[name] = dst
		}
		if dst.Kind == "" || l.Kind == "concurrency" {
			dst.Kind = l.Kind
		}
		if dst.CodePolicy == "" {
			dst.CodePolicy = l.CodePolicy
		}
		for _, s := range l.Seconds {
			dst.Seconds = Add(dst.Seconds, s.Unix, s.Counts)
		}
		for key, c := range l.Callers {
			d := dst.Callers[key]
			if d == nil {
				if len(dst.Callers) >= bounds.KeysPerLimiter {
					continue
				}
				d = &Caller{Policy: c.Policy, Source: c.Source}
				dst.Callers[key] = d
			}
			for _, s := range c.Seconds {
				if cells >= bounds.KeySeconds {
					break
				}
				before := len(d.Seconds)
				d.Seconds = Add(d.Seconds, s.Unix, s.Counts)
				cells += len(d.Seconds) - before
			}
		}
	}
	return dropped
}

// Trim drops the seconds before oldest, and the keys and limiters left
// without any.
func Trim(limiters map[string]*LimiterBatch, oldest int64) {
	keep := func(seconds []Second) []Second {
		kept := seconds[:0]
		for _, s := range seconds {
			if s.Unix >= oldest {
				kept = append(kept, s)
			}
		}
		return kept
	}
	for name, l := range limiters {
		l.Seconds = keep(l.Seconds)
		for key, c := range l.Callers {
			if c.Seconds = keep(c.Seconds); len(c.Seconds) == 0 {
				delete(l.Callers, key)
			}
		}
		if len(l.Seconds) == 0 {
			delete(limiters, name)
		}
	}
}
