package dashboard

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keyspace"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// TokenHeader is the request header that carries the actions token.
const TokenHeader = "X-Dashboard-Token"

// actionRequest is the body of a POST to api/action.
type actionRequest struct {
	Action   string `json:"action"` // reset, block, unblock, set, unset
	Name     string `json:"name"`   // the limiter
	Key      string `json:"key"`    // the caller key; for set and unset, empty means the whole limiter
	Duration string `json:"duration"`
	Policy   string `json:"policy"`
}

// maxActionBody bounds an action's body.
const maxActionBody = 64 << 10

// apiAction performs an action, once the request has shown it comes from
// the dashboard's page and carries the token.
func (h *Handler) apiAction(w http.ResponseWriter, r *http.Request) {
	if status, msg := h.admit(r); status != 0 {
		if status == http.StatusForbidden || status == http.StatusUnauthorized {
			h.cfg.logger.Warn("dashboard: action refused", slog.String("reason", msg), slog.String("remote", r.RemoteAddr))
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
		return
	}
	var req actionRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxActionBody))
	dec.DisallowUnknownFields()
	decodeErr := dec.Decode(&req)
	h.serve(w, r, func(ctx context.Context, now time.Time) (any, error) {
		if decodeErr != nil {
			return nil, apiError{http.StatusBadRequest, "dashboard: the action is not valid JSON: " + decodeErr.Error()}
		}
		v, ok, err := h.limiter(ctx, now, req.Name)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, apiError{http.StatusNotFound, "dashboard: no limiter named " + strconv.Quote(req.Name) + " is known"}
		}
		done, err := h.act(ctx, v, req)
		if err != nil {
			return nil, err
		}
		h.cfg.logger.Info("dashboard: action taken", slog.String("action", req.Action), slog.String("limiter", req.Name),
			slog.String("key", strconv.Quote(req.Key)), slog.String("remote", r.RemoteAddr))
		return map[string]any{"ok": true, "message": done}, nil
	})
}

// admit checks that actions are enabled, that r comes from the
// dashboard's own page and that it carries the token: a status and message
// to refuse it with, or 0.
func (h *Handler) admit(r *http.Request) (int, string) {
	if h.cfg.token == "" {
		return http.StatusForbidden, "dashboard: actions are not enabled (dashboard.WithActions)"
	}
	// A browser says where a request comes from. A page of another site
	// can make it send a POST (a form, or fetch without reading the answer);
	// both headers then name that site.
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return http.StatusForbidden, "dashboard: cross-site request refused"
	}
	if origin := r.Header.Get("Origin"); origin != "" {
		u, err := url.Parse(origin)
		if err != nil || u.Host != r.Host {
			return http.StatusForbidden, "dashboard: cross-origin request refused"
		}
	}
	// JSON only: a form of another site cannot send it without the browser
	// asking this server first, which it does not allow.
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return http.StatusUnsupportedMediaType, "dashboard: an action is a JSON body (Content-Type: application/json)"
	}
	token := r.Header.Get(TokenHeader)
	if token == "" {
		return http.StatusUnauthorized, "dashboard: the token is missing (header " + TokenHeader + ")"
	}
	if subtle.ConstantTimeCompare([]byte(token), []byte(h.cfg.token)) != 1 {
		return http.StatusForbidden, "dashboard: wrong token"
	}
	return 0, ""
}

// act performs req on v and says what it did.
func (h *Handler) act(ctx context.Context, v limiterView, req actionRequest) (string, error) {
	bad := func(format string, args ...any) error {
		return apiError{http.StatusBadRequest, "dashboard: " + fmt.Sprintf(format, args...)}
	}
	needKey := func() error {
		if req.Key == "" {
			return bad("%s needs a key", req.Action)
		}
		return nil
	}
	// invalid says whether err is the request's fault (400) rather than
	// Redis's (502, logged).
	invalid := func(err error) error {
		if errors.Is(err, throttle.ErrInvalidPolicy) || errors.Is(err, throttle.ErrInvalidKey) ||
			errors.Is(err, throttle.ErrInvalidDelay) || errors.Is(err, throttle.ErrInvalidOption) {
			return bad("%v", err)
		}
		return err
	}
	if req.Key != "" && keyspace.IsHashed(req.Key) {
		return "", bad("%q is a key stored by its hash (WithKeyHashing): the dashboard cannot act on it", req.Key)
	}
	switch req.Action {
	case "reset", "block", "unblock":
		if err := needKey(); err != nil {
			return "", err
		}
		rd, err := h.inv.readerFor(v)
		if err != nil {
			return "", err
		}
		if rd == nil || (rd.rate == nil && rd.conc == nil) {
			return "", bad("the policy of %q is not known here: give it with WithCodePolicies", v.Name)
		}
		if req.Action == "reset" {
			if rd.conc != nil {
				err = rd.conc.Reset(ctx, req.Key)
			} else {
				err = rd.rate.Reset(ctx, req.Key)
			}
			return "reset " + strconv.Quote(req.Key), invalid(err)
		}
		if rd.rate == nil {
			return "", bad("a concurrency cap has no block")
		}
		if req.Action == "unblock" {
			blocked, err := rd.rate.BlockedFor(ctx, req.Key)
			if err != nil {
				return "", invalid(err)
			}
			if blocked == 0 {
				return strconv.Quote(req.Key) + " was not blocked: nothing changed", nil
			}
			done := "unblocked " + strconv.Quote(req.Key)
			if (v.Algorithm == "gcra" || v.Algorithm == "tb") && !v.Leased {
				done += " (a TokenBucket or GCRA keeps its block in its state: the key was reset, its bookings and waiting room cleared)"
			}
			return done, invalid(rd.rate.Unblock(ctx, req.Key))
		}
		d, err := time.ParseDuration(req.Duration)
		if err != nil {
			return "", bad("block for how long? %v", err)
		}
		if err := rd.rate.BlockFor(ctx, req.Key, d); err != nil {
			return "", invalid(err)
		}
		return "blocked " + strconv.Quote(req.Key) + " for " + d.String(), nil
	case "set", "unset":
		if !v.Named || v.Kind == kindConcurrency {
			return "", bad("policies are stored for rate limiters only; %q is a concurrency cap", v.Name)
		}
		keys := []string{}
		what := "every key of " + strconv.Quote(v.Name)
		if req.Key != "" {
			keys, what = []string{req.Key}, strconv.Quote(req.Key)
		}
		if req.Action == "unset" {
			if err := h.store.Unset(ctx, v.Name, keys...); err != nil {
				return "", invalid(err)
			}
			return "removed the policy stored for " + what, nil
		}
		p, err := throttle.ParsePolicy(req.Policy)
		if err != nil {
			return "", bad("%v", err)
		}
		if err := h.store.Set(ctx, v.Name, p, keys...); err != nil {
			return "", invalid(err)
		}
		return "stored " + p.String() + " for " + what, nil
	}
	return "", bad("unknown action %q: reset, block, unblock, set or unset", req.Action)
}
