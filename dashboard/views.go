package dashboard

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"

	"github.com/jobthrottle/jobthrottle/dashboard/internal/fleet"
	"github.com/jobthrottle/jobthrottle/internal/keyspace"
)

// The kinds of limiter.
const (
	kindRate        = "rate"
	kindConcurrency = "concurrency"
)

// window is how far back the charts and the counts go.
const window = 15 * time.Minute

// forgotten is how long after a Publisher last saw a limiter the
// dashboard stops listing it (unless it has keys in Redis).
const forgotten = 24 * time.Hour

// limiterView is one limiter as the pages show it.
type limiterView struct {
	Name         string     `json:"name"`
	Kind         string     `json:"kind"`
	Algorithm    string     `json:"algorithm,omitempty"`
	Policy       string     `json:"policy"` // in force for keys without one of their own
	Source       string     `json:"source"` // where Policy comes from: code or stored
	CodePolicy   string     `json:"codePolicy"`
	StoredPolicy string     `json:"storedPolicy"`
	Overrides    []override `json:"overrides"`
	Invalid      []string   `json:"invalid,omitempty"`
	Keys         int        `json:"keys"` // keys with state in Redis
	Rates        rates      `json:"rates"`
	HeldBack     int64      `json:"heldBack"` // throttled, last 15 minutes
	Named        bool       `json:"named"`    // always true: every limiter has a name
	// Live: its processes apply stored policies (throttle.WithLivePolicies),
	// as the registry of names says; a stored policy of a limiter that is
	// not live is shown but not in force.
	Live bool `json:"live"`
	// Leased: its processes decide from leased shares
	// (throttle.WithLeasedShares), as the registry of names says; a key's
	// state is then the rest the shares leave.
	Leased bool `json:"leased"`
	// Rules are the worker's rules that use the limiter, by name, as the
	// registry of names says.
	Rules      []string `json:"rules"`
	registered bool     // in the registry of names
}

// override is a policy stored for one caller key.
type override struct {
	Key    string `json:"key"`
	Policy string `json:"policy"`
}

// rates are decisions per second, averaged over the last ten seconds.
type rates struct {
	Admitted    float64 `json:"admitted"`
	Throttled   float64 `json:"throttled"`
	Rescheduled float64 `json:"rescheduled"`
}

// rateSpan is what rates average over; the last two seconds are left out,
// as the fleet's counts for them may not all be written yet.
const rateSpan = 10 * time.Second

// limiters returns every limiter known: from the Publishers' records, the
// keys in Redis and WithCodePolicies, sorted by name.
func (h *Handler) limiters(ctx context.Context, now time.Time, withCounts bool) ([]limiterView, error) {
	publishedLimiters, err := fleet.Limiters(ctx, h.client, h.cfg.prefix)
	if err != nil {
		return nil, err
	}
	keys, err := h.inv.keys(ctx)
	if err != nil {
		return nil, err
	}
	views := map[string]*limiterView{}
	get := func(name string) *limiterView {
		if v := views[name]; v != nil {
			return v
		}
		v := &limiterView{Name: name, Kind: kindRate, Named: true, Rules: []string{}}
		views[name] = v
		return v
	}
	for _, l := range publishedLimiters {
		if now.Sub(l.Seen) > forgotten {
			continue // no process has used it for a day
		}
		v := get(l.Name)
		v.Kind = cmp.Or(l.Kind, v.Kind)
		v.CodePolicy = l.CodePolicy
	}
	for name, lk := range keys {
		v := get(name)
		v.Keys = len(lk.callers)
		v.Algorithm = lk.algorithm
		if lk.algorithm == "conc" {
			v.Kind = kindConcurrency
		}
	}
	// The limiters' own records of their policies in code (the registry
	// of names), for those no Publisher reports.
	registered, err := h.client.HGetAll(ctx, keyspace.Registry(h.cfg.prefix)).Result()
	if err != nil {
		return nil, err
	}
	for name, value := range registered {
		entry, ok := keyspace.RegistryEntry(value)
		if !ok {
			continue // not the library's
		}
		form := entry.Policy
		v := get(name)
		v.Live, v.Leased, v.Rules, v.registered = entry.Live, entry.Leased, entry.Rules, true
		v.CodePolicy = cmp.Or(v.CodePolicy, form)
		if v.Algorithm == "" {
			v.Algorithm, _, _ = strings.Cut(form, ":") // before its keys are found
		}
		if strings.HasPrefix(form, "conc:") {
			v.Kind = kindConcurrency
		}
	}
	// The policies given (WithCodePolicies) fill in only for limiters
	// that neither publish nor record themselves: those that do say what
	// their processes run.
	for name, p := range h.cfg.policies {
		if v := get(name); v.CodePolicy == "" {
			v.CodePolicy = p.String()
		}
	}
	out := make([]limiterView, 0, len(views))
	for _, v := range views {
		if err := h.describe(ctx, v); err != nil {
			return nil, err
		}
		if withCounts {
			if err := h.count(ctx, v, now); err != nil {
				return nil, err
			}
		}
		out = append(out, *v)
	}
	slices.SortFunc(out, func(a, b limiterView) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// limiter returns the limiter named name, with its counts; ok is false
// when none is known.
func (h *Handler) limiter(ctx context.Context, now time.Time, name string) (limiterView, bool, error) {
	all, err := h.limiters(ctx, now, false)
	if err != nil {
		return limiterView{}, false, err
	}
	for _, v := range all {
		if v.Name == name {
			return v, true, h.count(ctx, &v, now)
		}
	}
	return limiterView{}, false, nil
}

// describe fills in v's policies: the one stored for its name, else its
// code's.
func (h *Handler) describe(ctx context.Context, v *limiterView) error {
	v.Policy, v.Source = v.CodePolicy, "code"
	if v.Kind == kindConcurrency {
		return nil
	}
	stored, err := h.store.Get(ctx, v.Name)
	if err != nil {
		return err
	}
	if stored.Policy != nil {
		v.StoredPolicy = stored.Policy.String()
		if v.Live || !v.registered {
			v.Policy, v.Source = v.StoredPolicy, "stored"
		}
	}
	for key, p := range stored.Keys {
		v.Overrides = append(v.Overrides, override{Key: key, Policy: p.String()})
	}
	slices.SortFunc(v.Overrides, func(a, b override) int { return strings.Compare(a.Key, b.Key) })
	for field, why := range stored.Invalid {
		v.Invalid = append(v.Invalid, field+": "+why)
	}
	slices.Sort(v.Invalid)
	return nil
}

// count fills in v's rates over the last ten seconds and what it held back
// over the last 15 minutes.
func (h *Handler) count(ctx context.Context, v *limiterView, now time.Time) error {
	end := now.Truncate(time.Second).Add(time.Second)
	points, err := fleet.LimiterSeries(ctx, h.client, h.cfg.prefix, v.Name, end.Add(-window), end)
	if err != nil {
		return err
	}
	var r rates
	from := now.Add(-rateSpan - 2*time.Second)
	to := now.Add(-2 * time.Second)
	for _, p := range points {
		v.HeldBack += p.Throttled // a task sent back was throttled first
		if !p.At.Before(from) && p.At.Before(to) {
			r.Admitted += float64(p.Admitted)
			r.Throttled += float64(p.Throttled)
			r.Rescheduled += float64(p.Rescheduled)
		}
	}
	span := rateSpan.Seconds()
	v.Rates = rates{Admitted: r.Admitted / span, Throttled: r.Throttled / span, Rescheduled: r.Rescheduled / span}
	return nil
}
