package dashboard

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"

	"github.com/jobthrottle/jobthrottle/dashboard/internal/fleet"
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
	Named        bool       `json:"named"`
	form         string     // the policy in the keys of a limiter without a name
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

func (v limiterView) named() bool { return v.Named }

// keysName is the name the limiter's keys are found under: its policy for
// a limiter without a name and for a concurrency cap, else its name.
func (v limiterView) keysName() string { return cmp.Or(v.form, v.Name) }

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
		v := &limiterView{Name: name, Kind: kindRate, Named: true}
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
		v.Algorithm, v.form = lk.algorithm, lk.form
		if lk.algorithm == "conc" {
			v.Kind = kindConcurrency
		}
	}
	for name, p := range h.cfg.policies {
		get(name).CodePolicy = p.String()
	}
	published := make(map[string]bool, len(publishedLimiters))
	for _, l := range publishedLimiters {
		published[l.Name] = true
	}
	for _, v := range views {
		// A concurrency cap's keys carry its policy, never its name: a named
		// cap shows the keys of its policy, which are its own (caps of one
		// policy share their slots).
		if lk := keys[v.CodePolicy]; v.Kind == kindConcurrency && v.CodePolicy != v.Name && lk != nil {
			v.Keys, v.Algorithm, v.form = len(lk.callers), lk.algorithm, v.CodePolicy
			if !published[v.CodePolicy] {
				delete(views, v.CodePolicy)
			}
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

// describe fills in v's policies: the policy in its keys for a limiter
// without a name; else the one stored for its name, else its code's.
func (h *Handler) describe(ctx context.Context, v *limiterView) error {
	if isPolicyForm(v.Name) {
		// A limiter without a name is named after its policy; none can be
		// stored for it.
		v.Named, v.form = false, v.Name
		v.CodePolicy = v.Name
		if strings.HasPrefix(v.Name, "conc:") {
			v.Kind = kindConcurrency
		}
	}
	v.Policy, v.Source = v.CodePolicy, "code"
	if !v.Named || v.Kind == kindConcurrency {
		return nil
	}
	stored, err := h.store.Get(ctx, v.Name)
	if err != nil {
		return err
	}
	if stored.Policy != nil {
		v.StoredPolicy = stored.Policy.String()
		v.Policy, v.Source = v.StoredPolicy, "stored"
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

// isPolicyForm reports a name that is a policy's short form: the name of a
// limiter created without WithName.
func isPolicyForm(name string) bool {
	alg, _, ok := strings.Cut(name, ":")
	if !ok {
		return false
	}
	switch alg {
	case "gcra", "tb", "lb", "fw", "sl", "sw", "quota", "conc":
		return true
	}
	return false
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
