package dashboard

import (
	"embed"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"

	"github.com/jobthrottle/jobthrottle/internal/redisclient"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

//go:embed assets
var assets embed.FS

var pages = template.Must(template.ParseFS(assets, "assets/page.html"))

// Handler serves the dashboard. Mount it under any path, with
// http.StripPrefix; every link it writes is relative. It is safe for
// concurrent use. The zero value is not usable: call New.
type Handler struct {
	client redis.UniversalClient
	cfg    config
	store  *throttle.PolicyStore
	mux    *http.ServeMux
	inv    *inventory
}

// New returns the dashboard of the limiters in client's Redis (a
// *redis.Client, or a *redis.ClusterClient for a Redis Cluster: given a
// *redis.Client on one node of a Cluster, which would see that node's keys
// only, its pages answer with an error that names redis.NewClusterClient).
// Its options and their defaults:
//
//	WithPrefix(p)            "throttle:"        the limiters' and Publishers' key prefix
//	WithActions(token)       none: read-only    reset, block, unblock, store policies
//	WithCodePolicies(m)      none               policies of named limiters no Publisher saw
//	WithPageSize(n)          50                 keys on a page
//	WithTimeout(d)           5s                 Redis calls of one request
//	WithLogger(l)            slog.Default()     failed requests, actions, refused actions
//
// A nil client, another kind of client or a bad option fails with an error
// wrapping [ErrInvalidOption]. New does not reach Redis.
func New(client redis.UniversalClient, opts ...Option) (*Handler, error) {
	if redisclient.IsNil(client) {
		return nil, fmt.Errorf("%w: nil redis client", ErrInvalidOption)
	}
	redisclient.FollowFailovers(client)
	switch client.(type) {
	case *redis.Client, *redis.ClusterClient:
	default:
		return nil, fmt.Errorf("%w: the dashboard scans keys with a *redis.Client or *redis.ClusterClient, not a %T", ErrInvalidOption, client)
	}
	cfg := config{prefix: throttle.DefaultPrefix, pageSize: DefaultPageSize, timeout: DefaultTimeout}
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("%w: nil option", ErrInvalidOption)
		}
		if err := opt.apply(&cfg); err != nil {
			return nil, err
		}
	}
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	store, err := throttle.NewPolicyStore(client, cfg.prefix)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	h := &Handler{client: client, cfg: cfg, store: store, mux: http.NewServeMux()}
	h.inv = newInventory(h)
	static, _ := fs.Sub(assets, "assets")
	h.mux.Handle("GET /assets/", http.StripPrefix("/assets/", http.FileServerFS(static)))
	h.mux.HandleFunc("GET /{$}", h.page("overview"))
	h.mux.HandleFunc("GET /limiter", h.page("limiter"))
	h.mux.HandleFunc("GET /key", h.page("key"))
	h.mux.HandleFunc("GET /api/overview", h.apiOverview)
	h.mux.HandleFunc("GET /api/limiter", h.apiLimiter)
	h.mux.HandleFunc("GET /api/keys", h.apiKeys)
	h.mux.HandleFunc("GET /api/key", h.apiKey)
	h.mux.HandleFunc("GET /api/series", h.apiSeries)
	h.mux.HandleFunc("POST /api/action", h.apiAction)
	return h, nil
}

// ServeHTTP serves the dashboard's pages, its data and its actions.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "" {
		// Mounted at "/x" and asked for "/x": the relative links need the
		// slash. The browser resolves the relative Location against what
		// it asked for (http.Redirect would resolve it against the path
		// StripPrefix left, which is empty).
		w.Header().Set("Location", lastSegment(r))
		w.WriteHeader(http.StatusFound)
		return
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Referrer-Policy", "same-origin")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; object-src 'none'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
	h.mux.ServeHTTP(w, r)
}

// lastSegment returns the last element of the path the client asked for,
// with a slash, and the query: a Location relative to what it asked for.
// "./" keeps a segment holding ':' from reading as a scheme.
func lastSegment(r *http.Request) string {
	p, query, _ := strings.Cut(r.RequestURI, "?")
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		p = p[i+1:]
	}
	if query != "" {
		query = "?" + query
	}
	return "./" + p + "/" + query
}

// pageData is what the page template shows before the script fills it in.
type pageData struct {
	Page    string // overview, limiter or key
	Name    string // the limiter's name
	Key     string // the caller key
	Actions bool
}

// page serves the HTML of one page; its script fetches the data.
func (h *Handler) page(which string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		d := pageData{Page: which, Name: r.URL.Query().Get("name"), Key: r.URL.Query().Get("key"), Actions: h.cfg.token != ""}
		if which != "overview" && d.Name == "" || which == "key" && d.Key == "" {
			http.Error(w, "dashboard: missing name or key in the address", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if err := pages.Execute(w, d); err != nil {
			h.cfg.logger.Warn("dashboard: writing a page", slog.Any("error", err))
		}
	}
}
