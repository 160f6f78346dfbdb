package dashboard

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jobthrottle/jobthrottle/dashboard/internal/fleet"
	"github.com/jobthrottle/jobthrottle/internal/bounded"
	"github.com/jobthrottle/jobthrottle/internal/redisclient"
	"github.com/jobthrottle/jobthrottle/internal/scan"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// hottest is how many keys a limiter's page ranks.
const hottest = 10

// apiError is a request the dashboard cannot answer.
type apiError struct {
	status int
	msg    string
}

func (e apiError) Error() string { return e.msg }

// serve runs answer within the timeout and writes its value as JSON, or its
// error. The request is answered when the timeout ends, whatever the
// client's options: a Redis that hangs holds a go-redis call for its read
// timeout times its retries (5 s and more with the defaults), which then
// finishes in the background.
func (h *Handler) serve(w http.ResponseWriter, r *http.Request, answer func(ctx context.Context, now time.Time) (any, error)) {
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.timeout)
	defer cancel()
	var v any
	err := bounded.Call(ctx, func(ctx context.Context) error {
		now, err := fleet.Now(ctx, h.client)
		if err != nil {
			return err
		}
		answered, err := answer(ctx, now)
		if err == nil {
			v = answered // read only once Call returned nil: this ran to its end
		}
		return err
	})
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		// Redis's own errors name its addresses: they go to the log, not
		// to whoever can see the page.
		status, msg := http.StatusBadGateway, "dashboard: Redis did not answer; the server's log says why"
		var bad apiError
		if errors.As(err, &bad) {
			status, msg = bad.status, bad.msg
		} else if errors.Is(err, scan.ErrClusterNode) || redisclient.MovedOnPlainClient(h.client, err) {
			msg = "dashboard: " + scan.ErrClusterNode.Error()
			h.cfg.logger.Warn("dashboard: a request failed", slog.String("path", r.URL.Path), slog.Any("error", err))
		} else {
			h.cfg.logger.Warn("dashboard: a request failed", slog.String("path", r.URL.Path), slog.Any("error", err))
		}
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
		return
	}
	if m, ok := v.(map[string]any); ok {
		m["apiVersion"] = APIVersion
	}
	_ = json.NewEncoder(w).Encode(v)
}

// APIVersion is the version of the dashboard's read API (its api/...
// endpoints, docs/dashboard.md): every answer carries it as "apiVersion".
// It is raised when a field is removed or changes meaning; fields are
// added within a version.
const APIVersion = 1

// processSeen is how recently a Publisher must have written to count as
// part of the fleet.
const processSeen = time.Minute

func (h *Handler) apiOverview(w http.ResponseWriter, r *http.Request) {
	h.serve(w, r, func(ctx context.Context, now time.Time) (any, error) {
		views, err := h.limiters(ctx, now, true)
		if err != nil {
			return nil, err
		}
		procs, err := fleet.Processes(ctx, h.client, h.cfg.prefix, now.Add(-processSeen))
		if err != nil {
			return nil, err
		}
		names := make([]string, len(procs))
		for i, p := range procs {
			names[i] = p.Name
		}
		return map[string]any{"now": now.UnixMilli(), "limiters": views, "processes": names, "actions": h.cfg.token != ""}, nil
	})
}

// named returns the limiter the request names, or a 404.
func (h *Handler) named(ctx context.Context, r *http.Request, now time.Time) (limiterView, error) {
	name := r.URL.Query().Get("name")
	v, ok, err := h.limiter(ctx, now, name)
	if err == nil && !ok {
		err = apiError{http.StatusNotFound, "dashboard: no limiter named " + strconv.Quote(name) + " is known"}
	}
	return v, err
}

func (h *Handler) apiLimiter(w http.ResponseWriter, r *http.Request) {
	h.serve(w, r, func(ctx context.Context, now time.Time) (any, error) {
		v, err := h.named(ctx, r, now)
		if err != nil {
			return nil, err
		}
		top, _, err := fleet.Ranked(ctx, h.client, h.cfg.prefix, v.Name, fleet.HeldBack, now.Add(-window), "", 0, hottest)
		if err != nil {
			return nil, err
		}
		rows := make([]fleet.KeyActivity, 0, len(top))
		for _, a := range top {
			if a.HeldBack > 0 {
				rows = append(rows, a)
			}
		}
		states, err := h.states(ctx, v, rows)
		if err != nil {
			return nil, err
		}
		return map[string]any{"now": now.UnixMilli(), "limiter": v, "hottest": states, "actions": h.cfg.token != ""}, nil
	})
}

// states reads the keys' states, with their counts.
func (h *Handler) states(ctx context.Context, v limiterView, rows []fleet.KeyActivity) ([]keyState, error) {
	rd, err := h.inv.readerFor(v)
	if err != nil {
		return nil, err
	}
	keys, err := h.inv.keys(ctx)
	if err != nil {
		return nil, err
	}
	var hashed map[string]bool
	if lk := keys[v.Name]; lk != nil {
		hashed = lk.hashed
	}
	callers := make([]string, len(rows))
	for i, a := range rows {
		callers[i] = a.Key
	}
	states, err := rd.readAll(ctx, callers, hashed)
	if err != nil {
		return nil, err
	}
	for i, a := range rows {
		states[i].Admitted, states[i].HeldBack = a.Admitted, a.HeldBack
	}
	return states, nil
}

func (h *Handler) apiKeys(w http.ResponseWriter, r *http.Request) {
	h.serve(w, r, func(ctx context.Context, now time.Time) (any, error) {
		v, err := h.named(ctx, r, now)
		if err != nil {
			return nil, err
		}
		q := r.URL.Query()
		prefix, sortBy := q.Get("prefix"), cmp.Or(q.Get("sort"), "held")
		page, _ := strconv.Atoi(q.Get("page"))
		if sortBy != "held" && sortBy != "admitted" && sortBy != "key" {
			return nil, apiError{http.StatusBadRequest, "dashboard: sort by held, admitted or key, not " + strconv.Quote(sortBy)}
		}
		rows, err := h.keyRows(ctx, v, now, prefix, sortBy)
		if err != nil {
			return nil, err
		}
		pages := max(1, (len(rows)+h.cfg.pageSize-1)/h.cfg.pageSize)
		page = min(max(page, 1), pages)
		shown := rows[(page-1)*h.cfg.pageSize : min(len(rows), page*h.cfg.pageSize)]
		states, err := h.states(ctx, v, shown)
		if err != nil {
			return nil, err
		}
		return map[string]any{"now": now.UnixMilli(), "rows": states, "total": len(rows), "page": page, "pages": pages}, nil
	})
}

// keyRows returns v's keys that start with prefix, sorted: the keys with
// state in Redis and those with counts in the last 15 minutes.
func (h *Handler) keyRows(ctx context.Context, v limiterView, now time.Time, prefix, sortBy string) ([]fleet.KeyActivity, error) {
	active, _, err := fleet.Ranked(ctx, h.client, h.cfg.prefix, v.Name, fleet.HeldBack, now.Add(-window), prefix, 0, -1)
	if err != nil {
		return nil, err
	}
	keys, err := h.inv.keys(ctx)
	if err != nil {
		return nil, err
	}
	rows := active
	if lk := keys[v.Name]; lk != nil {
		known := make(map[string]bool, len(active))
		for _, a := range active {
			known[a.Key] = true
		}
		for _, c := range lk.callers {
			if !known[c] && strings.HasPrefix(c, prefix) {
				rows = append(rows, fleet.KeyActivity{Key: c})
			}
		}
	}
	slices.SortFunc(rows, func(a, b fleet.KeyActivity) int {
		switch sortBy {
		case "held":
			if c := cmp.Compare(b.HeldBack, a.HeldBack); c != 0 {
				return c
			}
		case "admitted":
			if c := cmp.Compare(b.Admitted, a.Admitted); c != 0 {
				return c
			}
		}
		return strings.Compare(a.Key, b.Key)
	})
	return rows, nil
}

func (h *Handler) apiKey(w http.ResponseWriter, r *http.Request) {
	h.serve(w, r, func(ctx context.Context, now time.Time) (any, error) {
		v, err := h.named(ctx, r, now)
		if err != nil {
			return nil, err
		}
		key := r.URL.Query().Get("key")
		if key == "" {
			return nil, apiError{http.StatusBadRequest, "dashboard: no key given"}
		}
		activity, err := fleet.Activity(ctx, h.client, h.cfg.prefix, v.Name, now.Add(-window), []string{key})
		if err != nil {
			return nil, err
		}
		a := activity[key]
		a.Key = key
		states, err := h.states(ctx, v, []fleet.KeyActivity{a})
		if err != nil {
			return nil, err
		}
		s := states[0]
		var plan string
		s.Source, plan = h.keySource(ctx, v, key, now)
		if plan != "" && plan != s.Policy {
			// The code's plan chose this key's policy, which the dashboard
			// cannot run: the state is read under the plan's policy.
			if s, err = h.readUnder(ctx, v, plan, key); err != nil {
				return nil, err
			}
			s.Admitted, s.HeldBack = a.Admitted, a.HeldBack
			s.Source = "the code's plan for this key"
		}
		if s.Policy == "" {
			s.Policy = v.Policy
		}
		bookings, err := h.bookings(ctx, v, key, now)
		if err != nil {
			return nil, err
		}
		shares, err := h.shares(ctx, v, key, s.Policy)
		if err != nil {
			return nil, err
		}
		return map[string]any{"now": now.UnixMilli(), "limiter": v, "state": s, "bookings": bookings, "shares": shares, "actions": h.cfg.token != ""}, nil
	})
}

// keySource says where the policy in force for key comes from, and the
// policy a plan chose for it, as the fleet's processes last saw it.
func (h *Handler) keySource(ctx context.Context, v limiterView, key string, now time.Time) (source, plan string) {
	for _, o := range v.Overrides {
		if o.Key == key {
			return "stored for this key", ""
		}
	}
	if v.Source == "code" {
		policy, source, err := fleet.KeyPolicy(ctx, h.client, h.cfg.prefix, v.Name, key, now.Add(-window))
		if err == nil && source == string(throttle.SourcePlan) && policy != "" {
			return "the code's plan for this key", policy
		}
	}
	return v.Source, ""
}

// readUnder reads key's state under policy, a plan's, with a limiter of
// its own.
func (h *Handler) readUnder(ctx context.Context, v limiterView, policy, key string) (keyState, error) {
	v.CodePolicy, v.StoredPolicy = policy, ""
	rd, err := h.inv.newReader(v)
	if err != nil {
		return keyState{}, err
	}
	return rd.read(ctx, key)
}

// seriesPoint is one second: its Unix time and its admitted, throttled
// and rescheduled counts.
type seriesPoint [4]int64

func (h *Handler) apiSeries(w http.ResponseWriter, r *http.Request) {
	h.serve(w, r, func(ctx context.Context, now time.Time) (any, error) {
		q := r.URL.Query()
		name, key := q.Get("name"), q.Get("key")
		if name == "" {
			return nil, apiError{http.StatusBadRequest, "dashboard: no limiter named"}
		}
		// to the current second, which the fleet is still counting
		end := now.Truncate(time.Second).Add(time.Second)
		from := end.Add(-window)
		if since, err := strconv.ParseInt(q.Get("since"), 10, 64); err == nil && time.Unix(since, 0).After(from) {
			from = time.Unix(since, 0)
		}
		var points []fleet.Point
		var err error
		if key != "" {
			points, err = fleet.KeySeries(ctx, h.client, h.cfg.prefix, name, key, from, end)
		} else {
			points, err = fleet.LimiterSeries(ctx, h.client, h.cfg.prefix, name, from, end)
		}
		if err != nil {
			return nil, err
		}
		out := make([]seriesPoint, len(points))
		for i, p := range points {
			out[i] = seriesPoint{p.At.Unix(), p.Admitted, p.Throttled, p.Rescheduled}
		}
		return map[string]any{"now": now.UnixMilli(), "points": out}, nil
	})
}
