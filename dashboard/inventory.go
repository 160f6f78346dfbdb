package dashboard

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/jobthrottle/jobthrottle/internal/scan"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// rescan is how long one scan of the keys serves requests: the pages ask
// every two seconds, perhaps from several browsers.
const rescan = 2 * time.Second

// inventory is what Redis holds under the prefix: the limiters and their
// caller keys, from one SCAN, and a limiter per name to read keys with.
type inventory struct {
	h *Handler

	mu      sync.Mutex // guards below; held during a scan, so one runs at a time
	scanned time.Time
	byName  map[string]*limiterKeys
	readers map[string]*reader // by limiter name, for the policy they were built with
}

// limiterKeys is one limiter's keys found by a scan.
type limiterKeys struct {
	name      string
	algorithm string // as in its keys: "gcra", …, "conc"
	callers   []string
	hashed    map[string]bool // callers stored by hash: they cannot be read
}

func newInventory(h *Handler) *inventory {
	return &inventory{h: h, readers: map[string]*reader{}}
}

// keys returns the limiters' keys, scanning again when the last scan is
// older than rescan.
func (inv *inventory) keys(ctx context.Context) (map[string]*limiterKeys, error) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if inv.byName != nil && time.Since(inv.scanned) < rescan {
		return inv.byName, nil
	}
	found, err := scan.Prefix(ctx, inv.h.client, inv.h.cfg.prefix, inv.h.cfg.timeout)
	if err != nil {
		return nil, err
	}
	byName := map[string]*limiterKeys{}
	seen := map[[2]string]bool{}
	for _, key := range found {
		info, err := keyspace.Parse(inv.h.cfg.prefix, key)
		if err != nil {
			continue // the worker's, the scheduler's, the Publishers' keys
		}
		name := info.Name
		lk := byName[name]
		if lk == nil {
			lk = &limiterKeys{name: name, algorithm: info.Algorithm, hashed: map[string]bool{}}
			byName[name] = lk
		}
		if seen[[2]string{name, info.Caller}] {
			continue
		}
		seen[[2]string{name, info.Caller}] = true
		lk.callers = append(lk.callers, info.Caller)
		if info.Hashed {
			lk.hashed[info.Caller] = true
		}
	}
	for _, lk := range byName {
		slices.Sort(lk.callers)
	}
	inv.byName, inv.scanned = byName, time.Now()
	return byName, nil
}

// reader reads the keys of one limiter with the library's limiter, built
// with its policy.
type reader struct {
	policy string // what it was built with, to notice a change
	leased bool   // with leased shares (WithLeasedShares), to notice a change
	live   bool   // with stored policies (WithLivePolicies), to notice a change
	rate   *throttle.Limiter
	conc   *throttle.ConcurrencyLimiter
}

// readerFor returns a reader of v's keys; nil when its policy is not known.
func (inv *inventory) readerFor(v limiterView) (*reader, error) {
	policy := cmp.Or(v.CodePolicy, v.StoredPolicy)
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if rd := inv.readers[v.Name]; rd != nil && rd.policy == policy && rd.leased == v.Leased && rd.live == v.Live {
		return rd, nil
	}
	rd, err := inv.newReader(v)
	if err == nil && rd != nil {
		inv.readers[v.Name] = rd
	}
	return rd, err
}

// newReader returns a new reader of v's keys under its policy in code, else
// the one stored for it; nil when neither is known. A live limiter's
// reader applies its stored policies as its processes do, for its name
// and for each key.
func (inv *inventory) newReader(v limiterView) (*reader, error) {
	policy := cmp.Or(v.CodePolicy, v.StoredPolicy)
	rd := &reader{policy: policy, leased: v.Leased, live: v.Live}
	opts := []throttle.Option{throttle.WithPrefix(inv.h.cfg.prefix), throttle.WithLogger(slog.New(slog.DiscardHandler)),
		keyspace.Inspecting.(throttle.Option)}
	client := inv.h.client
	var err error
	switch {
	case policy == "":
		return nil, nil
	case v.Kind == kindConcurrency:
		limit, lease, perr := keyspace.ParseConcurrency(policy)
		if perr != nil {
			return nil, perr
		}
		rd.conc, err = throttle.NewConcurrencyLimiter(client, v.Name, throttle.Concurrency{Limit: limit, Lease: lease}, opts...)
	default:
		p, perr := throttle.ParsePolicy(policy)
		if perr != nil {
			return nil, perr
		}
		if v.Leased {
			// Reads the rest the shares leave; holds no share itself.
			opts = append(opts, throttle.WithLeasedShares(0))
		}
		if v.Live {
			opts = append(opts, throttle.WithLivePolicies())
		}
		rd.rate, err = throttle.New(client, v.Name, p, opts...)
	}
	if err != nil {
		return nil, err
	}
	return rd, nil
}

// keyState is one key's state, as the tables show it.
type keyState struct {
	Key          string `json:"key"`
	Hashed       bool   `json:"hashed,omitempty"`
	Known        bool   `json:"known"` // the state could be read
	Throttled    bool   `json:"throttled"`
	Limit        int    `json:"limit"`
	Remaining    int    `json:"remaining"`
	RetryAfterMs int64  `json:"retryAfterMs"`
	ResetAfterMs int64  `json:"resetAfterMs"`
	BlockedForMs int64  `json:"blockedForMs"`
	Leases       int    `json:"leases"`
	Policy       string `json:"policy,omitempty"`
	Source       string `json:"source,omitempty"`
	Admitted     int64  `json:"admitted"`
	HeldBack     int64  `json:"heldBack"`
}

// read peeks at caller's state without changing it.
func (rd *reader) read(ctx context.Context, caller string) (keyState, error) {
	s := keyState{Key: caller}
	if rd == nil {
		return s, nil
	}
	var r throttle.Result
	var err error
	switch {
	case rd.rate != nil:
		if p, perr := rd.rate.PolicyFor(ctx, caller); perr == nil {
			s.Policy = p.String()
		}
		if r, err = rd.rate.Peek(ctx, caller); err == nil {
			var blocked time.Duration
			blocked, err = rd.rate.BlockedFor(ctx, caller)
			s.BlockedForMs = blocked.Milliseconds()
		}
	default:
		r, err = rd.conc.Peek(ctx, caller)
		s.Leases = r.Limit - r.Remaining
	}
	if err != nil {
		return s, err
	}
	s.Known = true
	s.Throttled = !r.Allowed || s.BlockedForMs > 0
	s.Limit, s.Remaining = r.Limit, r.Remaining
	s.RetryAfterMs, s.ResetAfterMs = r.RetryAfter.Milliseconds(), r.ResetAfter.Milliseconds()
	return s, nil
}

// readAll reads the states of callers, 16 at a time.
func (rd *reader) readAll(ctx context.Context, callers []string, hashed map[string]bool) ([]keyState, error) {
	states := make([]keyState, len(callers))
	errs := make([]error, len(callers))
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(16, len(callers)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if hashed[callers[i]] {
					states[i] = keyState{Key: callers[i], Hashed: true}
					continue
				}
				states[i], errs[i] = rd.read(ctx, callers[i])
			}
		}()
	}
	for i := range callers {
		next <- i
	}
	close(next)
	wg.Wait()
	return states, errors.Join(errs...)
}
