package throttle

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// How a named limiter keeps its stored policies (see stored.go) fresh.
// While decisions flow, one re-read runs in the background every
// liveRefresh; a decision that finds the last read older than liveStale
// (the limiter was idle) reads first. A policy stored at t is therefore in
// force for every decision that starts liveStale after t or later: such a
// decision uses a read that began after t.
const (
	liveRefresh = 250 * time.Millisecond
	liveStale   = 750 * time.Millisecond
	// liveReadLimit bounds a background read.
	liveReadLimit = time.Second
)

// live is a named limiter's view of its stored policies. Safe for
// concurrent use.
type live struct {
	key  string // the stored policy hash
	kind string // the limiter's algorithm
	set  atomic.Pointer[liveSet]
	busy atomic.Bool // a background read runs

	mu       sync.Mutex        // one synchronous read at a time; guards below
	reported map[string]string // field -> text last reported unreadable
	warned   time.Time         // when a failed read was last logged
}

// liveSet is one read of the stored policies.
type liveSet struct {
	read    time.Time // when the read began (or a failed one): nothing stored before is missing
	version string
	all     *spec
	keys    map[string]*spec
}

func newLive(prefix, name, kind string) *live {
	return &live{key: storedPolicyKey(prefix, name), kind: kind}
}

// current returns the stored policies in force, reading them first when
// the last read is older than liveStale, and starting a background read
// when it is older than liveRefresh.
func (lv *live) current(ctx context.Context, c *conn) *liveSet {
	set := lv.set.Load()
	if set == nil || time.Since(set.read) > liveStale {
		lv.mu.Lock()
		if set = lv.set.Load(); set == nil || time.Since(set.read) > liveStale {
			set = lv.refresh(ctx, c, set)
		}
		lv.mu.Unlock()
		return set
	}
	if time.Since(set.read) > liveRefresh && lv.busy.CompareAndSwap(false, true) {
		go func() {
			defer lv.busy.Store(false)
			ctx, cancel := context.WithTimeout(context.Background(), liveReadLimit)
			defer cancel()
			lv.mu.Lock()
			defer lv.mu.Unlock()
			if set := lv.set.Load(); time.Since(set.read) > liveRefresh {
				lv.refresh(ctx, c, set)
			}
		}()
	}
	return set
}

// refresh reads the stored policies (all of them only when their version
// moved) and installs what it read; a policy that cannot be read keeps the
// one in force before it. Called with mu held.
func (lv *live) refresh(ctx context.Context, c *conn, old *liveSet) *liveSet {
	next := &liveSet{read: time.Now()}
	if old != nil {
		next.version, next.all, next.keys = old.version, old.all, old.keys
	}
	var fields map[string]string
	err := c.call(ctx, func(ctx context.Context) error {
		if old != nil {
			v, err := c.client.HGet(ctx, lv.key, storedVersion).Result()
			if err == redis.Nil {
				v, err = "", nil
			}
			if err != nil || v == old.version {
				return err
			}
		}
		var err error
		if fields, err = c.client.HGetAll(ctx, lv.key).Result(); err != nil {
			return err
		}
		if fields[storedKind] == "" {
			// Say which algorithm reads this name, so that a policy of
			// another one is refused when it is set: at the first read
			// (and again should the hash have been deleted).
			c.client.HSetNX(ctx, lv.key, storedKind, lv.kind)
		}
		return nil
	})
	if err != nil {
		// Logged at most once per outageLogEvery: during an outage every
		// read fails.
		if time.Since(lv.warned) >= outageLogEvery {
			lv.warned = time.Now()
			c.cfg.log().LogAttrs(ctx, slog.LevelWarn, "throttle: could not read the stored policies; keeping those in force",
				slog.String("limiter", c.cfg.name), slog.Any("error", err))
		}
		if old == nil {
			// Nothing read yet: the next decision reads again, rather
			// than take "none stored" for a fresh answer.
			return next
		}
	} else if fields != nil {
		lv.install(ctx, c, next, fields)
	}
	lv.set.Store(next)
	return next
}

// install reads fields into next, keeping the policy in force for each
// field that cannot be read, and reporting it once.
func (lv *live) install(ctx context.Context, c *conn, next *liveSet, fields map[string]string) {
	previousAll, previousKeys := next.all, next.keys
	next.version = fields[storedVersion]
	next.all, next.keys = nil, map[string]*spec{}
	if lv.reported == nil {
		lv.reported = map[string]string{}
	}
	for field, text := range fields {
		caller, ok := storedCaller(field)
		if !ok {
			continue
		}
		sp, err := compileStored(text, lv.kind)
		if err != nil {
			if lv.reported[field] != text {
				lv.reported[field] = text
				c.cfg.log().LogAttrs(ctx, slog.LevelError, "throttle: a stored policy cannot be applied; keeping the one in force",
					slog.String("limiter", c.cfg.name), slog.String("field", field), slog.String("policy", text), slog.Any("error", err))
			}
			// keep what was in force for it
			if field == storedAll {
				sp = previousAll
			} else {
				sp = previousKeys[caller]
			}
			if sp == nil {
				continue
			}
		} else {
			delete(lv.reported, field)
			// a new spec, not yet shared: the one kept above has its source
			sp.source = SourceStoredForKey
			if field == storedAll {
				sp.source = SourceStored
			}
		}
		if field == storedAll {
			next.all = sp
		} else {
			next.keys[caller] = sp
		}
	}
}

// compileStored reads a stored policy and checks it is of kind.
func compileStored(text, kind string) (*spec, error) {
	p, err := ParsePolicy(text)
	if err != nil {
		return nil, err
	}
	sp := compiled(p)
	if err := ofKind(*sp, kind); err != nil {
		return nil, err
	}
	return sp, nil
}
