package dashboard_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/dashboard"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// hostile is a caller key an outsider chose: markup and script.
const hostile = `<script>alert("x")</script><img src=x onerror=alert(1)>&'`

const token = "0123456789abcdef-test-token"

// site is a dashboard over a Redis with one named limiter whose keys were
// used, mounted under /ops as a user would mount it.
type site struct {
	tgt     *redistest.Target
	limiter *throttle.Limiter
	srv     *httptest.Server
}

func newSite(t *testing.T, opts ...dashboard.Option) *site {
	t.Helper()
	tgt := redistest.New(t)
	ctx := context.Background()
	pub, err := dashboard.NewPublisher(tgt.Client, dashboard.WithPublishPrefix(tgt.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	l, err := throttle.New(tgt.Client, "partner-api", throttle.GCRA{Rate: throttle.PerMinute(2), Burst: 2},
		throttle.WithPrefix(tgt.Prefix), throttle.WithObserver(pub))
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{hostile, hostile, hostile, "tenant-1", "tenant-2", "tenant-2"} {
		if _, err := l.Allow(ctx, key); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	h, err := dashboard.New(tgt.Client, append([]dashboard.Option{dashboard.WithPrefix(tgt.Prefix), dashboard.WithLogger(nil)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return &site{tgt: tgt, limiter: l, srv: httptestServer(t, http.StripPrefix("/ops", h))}
}

// httptestServer serves h until the test ends.
func httptestServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// get fetches path and returns the status and body.
func (s *site) get(t *testing.T, path string) (int, string) {
	t.Helper()
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Get(s.srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// getJSON fetches path, expects 200 and decodes the body into v.
func (s *site) getJSON(t *testing.T, path string, v any) {
	t.Helper()
	status, body := s.get(t, path)
	if status != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, status, body)
	}
	if strings.Contains(body, "<script") || strings.Contains(body, "<img") {
		t.Fatalf("GET %s: the JSON carries raw markup: %s", path, body)
	}
	if err := json.Unmarshal([]byte(body), v); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
}

func q(kv ...string) string {
	v := url.Values{}
	for i := 0; i < len(kv); i += 2 {
		v.Set(kv[i], kv[i+1])
	}
	return v.Encode()
}

func TestDashboardPages(t *testing.T) {
	s := newSite(t)
	for _, tc := range []struct {
		path   string
		status int
		want   []string // in the body
	}{
		{"/ops/", 200, []string{"<h1>Limiters</h1>", `src="assets/app.js"`}},
		{"/ops/limiter?" + q("name", "partner-api"), 200, []string{`data-name="partner-api"`, "Hottest keys"}},
		{"/ops/key?" + q("name", "partner-api", "key", hostile), 200, []string{"&lt;script&gt;alert(", "Bookings ahead"}},
		{"/ops/limiter", 400, []string{"missing name"}},
		{"/ops/key?" + q("name", "partner-api"), 400, nil},
		{"/ops/nothing", 404, nil},
		{"/ops/assets/app.js", 200, []string{"textContent"}},
		{"/ops/assets/app.css", 200, nil},
		{"/ops/api/limiter?" + q("name", "nope"), 404, []string{"no limiter named"}},
		{"/ops/api/keys?" + q("name", "partner-api", "sort", "bogus"), 400, nil},
		{"/ops/api/series", 400, nil},
	} {
		status, body := s.get(t, tc.path)
		if status != tc.status {
			t.Errorf("GET %s: status %d, want %d (%s)", tc.path, status, tc.status, body)
		}
		for _, w := range tc.want {
			if !strings.Contains(body, w) {
				t.Errorf("GET %s: body lacks %q", tc.path, w)
			}
		}
		if strings.Contains(body, "<script>alert") || strings.Contains(body, "<img src=x") {
			t.Errorf("GET %s: the caller key reached the page as markup", tc.path)
		}
	}
	// Mounted at /ops, asked for /ops: the relative links need the slash.
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Get(s.srv.URL + "/ops?x=1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	base, _ := url.Parse(s.srv.URL + "/ops?x=1")
	if loc, err := base.Parse(resp.Header.Get("Location")); resp.StatusCode != http.StatusFound || err != nil || loc.RequestURI() != "/ops/?x=1" {
		t.Errorf("GET /ops: %d to %q, want a redirect to /ops/?x=1", resp.StatusCode, resp.Header.Get("Location"))
	}
}

func TestDashboardData(t *testing.T) {
	s := newSite(t)
	var overview struct {
		Limiters []struct {
			Name, Kind, Policy, Source, CodePolicy string
			Keys                                   int
			HeldBack                               int64
		}
		Processes []string
	}
	s.getJSON(t, "/ops/api/overview", &overview)
	if len(overview.Limiters) != 1 || len(overview.Processes) != 1 {
		t.Fatalf("overview: %+v", overview)
	}
	l := overview.Limiters[0]
	if l.Name != "partner-api" || l.Kind != "rate" || l.Policy != "gcra:2/1m:2" || l.Source != "code" || l.Keys != 3 || l.HeldBack != 1 {
		t.Errorf("overview's limiter = %+v; want partner-api, gcra:2/1m:2 from code, 3 keys, 1 held back", l)
	}

	var lim struct {
		Hottest []struct {
			Key                 string
			Throttled, Known    bool
			Admitted, HeldBack  int64
			RetryAfterMs, Limit int64
		}
	}
	s.getJSON(t, "/ops/api/limiter?"+q("name", "partner-api"), &lim)
	if len(lim.Hottest) != 1 || lim.Hottest[0].Key != hostile || !lim.Hottest[0].Throttled || lim.Hottest[0].HeldBack != 1 ||
		lim.Hottest[0].Admitted != 2 || lim.Hottest[0].RetryAfterMs <= 0 {
		t.Errorf("hottest = %+v; want the hostile key, throttled, 2 admitted and 1 held back", lim.Hottest)
	}

	var keys struct {
		Rows []struct {
			Key      string
			Admitted int64
		}
		Total, Page, Pages int
	}
	for _, tc := range []struct {
		query string
		want  []string
	}{
		{q("name", "partner-api"), []string{hostile, "tenant-1", "tenant-2"}},
		{q("name", "partner-api", "sort", "key"), []string{hostile, "tenant-1", "tenant-2"}},
		{q("name", "partner-api", "sort", "admitted"), []string{hostile, "tenant-2", "tenant-1"}},
		{q("name", "partner-api", "prefix", "tenant-", "sort", "admitted"), []string{"tenant-2", "tenant-1"}},
		{q("name", "partner-api", "prefix", "<script>"), []string{hostile}},
		{q("name", "partner-api", "prefix", "zzz"), nil},
	} {
		s.getJSON(t, "/ops/api/keys?"+tc.query, &keys)
		var got []string
		for _, r := range keys.Rows {
			got = append(got, r.Key)
		}
		if strings.Join(got, "|") != strings.Join(tc.want, "|") || keys.Total != len(tc.want) {
			t.Errorf("keys?%s = %q (total %d), want %q", tc.query, got, keys.Total, tc.want)
		}
	}

	var key struct {
		State struct {
			Key, Policy, Source string
			Throttled           bool
		}
		Bookings struct {
			Meter   bool
			Tickets []any // [] with none: the page's script reads its length
		}
	}
	s.getJSON(t, "/ops/api/key?"+q("name", "partner-api", "key", hostile), &key)
	if key.State.Key != hostile || key.State.Policy != "gcra:2/1m:2" || key.State.Source != "code" || !key.State.Throttled || !key.Bookings.Meter || key.Bookings.Tickets == nil {
		t.Errorf("key = %+v", key)
	}

	var series struct{ Points [][4]int64 }
	s.getJSON(t, "/ops/api/series?"+q("name", "partner-api"), &series)
	var sum [4]int64
	for _, p := range series.Points {
		for i := 1; i < 4; i++ {
			sum[i] += p[i]
		}
	}
	if len(series.Points) != 900 || sum[1] != 5 || sum[2] != 1 || sum[3] != 0 {
		t.Errorf("series: %d points adding up to %v; want 900 points, 5 admitted and 1 throttled", len(series.Points), sum[1:])
	}
	s.getJSON(t, "/ops/api/series?"+q("name", "partner-api", "key", hostile), &series)
	sum = [4]int64{}
	for _, p := range series.Points {
		sum[1], sum[2] = sum[1]+p[1], sum[2]+p[2]
	}
	if sum[1] != 2 || sum[2] != 1 {
		t.Errorf("the hostile key's series adds up to %v, want 2 admitted and 1 throttled", sum[1:3])
	}
}

// post sends an action as the dashboard's page does, with changes.
func (s *site) post(t *testing.T, body string, edit func(*http.Request)) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.srv.URL+"/ops/api/action", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Origin", s.srv.URL)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	req.Header.Set(dashboard.TokenHeader, token)
	if edit != nil {
		edit(req)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func action(kv ...string) string {
	m := map[string]string{}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	b, _ := json.Marshal(m)
	return string(b)
}

func TestDashboardActionsRefused(t *testing.T) {
	s := newSite(t, dashboard.WithActions(token))
	reset := action("action", "reset", "name", "partner-api", "key", hostile)
	for _, tc := range []struct {
		name   string
		edit   func(*http.Request)
		status int
	}{
		{"no token", func(r *http.Request) { r.Header.Del(dashboard.TokenHeader) }, http.StatusUnauthorized},
		{"wrong token", func(r *http.Request) { r.Header.Set(dashboard.TokenHeader, token+"x") }, http.StatusForbidden},
		{"cross-site fetch", func(r *http.Request) { r.Header.Set("Sec-Fetch-Site", "cross-site") }, http.StatusForbidden},
		{"same-site, other origin", func(r *http.Request) { r.Header.Set("Sec-Fetch-Site", "same-site") }, http.StatusForbidden},
		{"other origin", func(r *http.Request) {
			r.Header.Del("Sec-Fetch-Site")
			r.Header.Set("Origin", "https://evil.example")
		}, http.StatusForbidden},
		{"cross-site form", func(r *http.Request) {
			r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			r.Header.Set("Sec-Fetch-Site", "cross-site")
			r.Header.Set("Origin", "https://evil.example")
		}, http.StatusForbidden},
		{"form body", func(r *http.Request) { r.Header.Set("Content-Type", "text/plain") }, http.StatusUnsupportedMediaType},
	} {
		status, body := s.post(t, reset, tc.edit)
		if status != tc.status {
			t.Errorf("%s: status %d, want %d (%s)", tc.name, status, tc.status, body)
		}
	}
	// Nothing above was reset.
	if r, err := s.limiter.Peek(context.Background(), hostile); err != nil || r.Allowed {
		t.Fatalf("the key was reset by a refused request: %+v, %v", r, err)
	}
	// GET is not an action.
	if status, _ := s.get(t, "/ops/api/action"); status != http.StatusMethodNotAllowed {
		t.Errorf("GET api/action: status %d, want 405", status)
	}
	// A read-only dashboard refuses every action, token or not.
	ro := newSite(t)
	if status, _ := ro.post(t, reset, nil); status != http.StatusForbidden {
		t.Errorf("read-only dashboard: status %d, want 403", status)
	}
}

func TestDashboardActions(t *testing.T) {
	s := newSite(t, dashboard.WithActions(token))
	ctx := context.Background()
	store, err := throttle.NewPolicyStore(s.tgt.Client, s.tgt.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	blocked := func() time.Duration {
		d, err := s.limiter.BlockedFor(ctx, "tenant-1")
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	steps := []struct {
		body   string
		status int
		check  func() bool
	}{
		{action("action", "reset", "name", "partner-api", "key", hostile), 200, func() bool {
			r, err := s.limiter.Peek(ctx, hostile)
			return err == nil && r.Allowed && r.Remaining == 2
		}},
		{action("action", "block", "name", "partner-api", "key", "tenant-1", "duration", "1h"), 200, func() bool { return blocked() > 59*time.Minute }},
		{action("action", "unblock", "name", "partner-api", "key", "tenant-1"), 200, func() bool { return blocked() == 0 }},
		{action("action", "set", "name", "partner-api", "key", hostile, "policy", "gcra:10/s:5"), 200, func() bool {
			got, err := store.Get(ctx, "partner-api")
			return err == nil && got.Keys[hostile] != nil && got.Keys[hostile].String() == "gcra:10/1s:5"
		}},
		{action("action", "set", "name", "partner-api", "policy", "gcra:5/s:1"), 200, func() bool {
			got, err := store.Get(ctx, "partner-api")
			return err == nil && got.Policy != nil && got.Policy.String() == "gcra:5/1s:1"
		}},
		{action("action", "unset", "name", "partner-api", "key", hostile), 200, func() bool {
			got, err := store.Get(ctx, "partner-api")
			return err == nil && got.Keys[hostile] == nil && got.Policy != nil
		}},
		{action("action", "unset", "name", "partner-api"), 200, func() bool {
			got, err := store.Get(ctx, "partner-api")
			return err == nil && got.Policy == nil
		}},
		{action("action", "set", "name", "partner-api", "policy", "fw:10/m"), 400, nil}, // another algorithm
		{action("action", "set", "name", "partner-api", "policy", "nonsense"), 400, nil},
		{action("action", "block", "name", "partner-api", "key", "tenant-1", "duration", "soon"), 400, nil},
		{action("action", "block", "name", "partner-api", "key", "tenant-1", "duration", "-1s"), 400, nil},
		{action("action", "reset", "name", "partner-api"), 400, nil},
		{action("action", "explode", "name", "partner-api", "key", "x"), 400, nil},
		{action("action", "reset", "name", "nope", "key", "x"), 404, nil},
		{`{"action": "reset", "name": "partner-api", "key": "x", "extra": 1}`, 400, nil},
		{`not json`, 400, nil},
	}
	for _, st := range steps {
		status, body := s.post(t, st.body, nil)
		if status != st.status {
			t.Errorf("%s: status %d, want %d (%s)", st.body, status, st.status, body)
			continue
		}
		if st.check != nil && !st.check() {
			t.Errorf("%s: answered %s, but Redis does not show it", st.body, body)
		}
	}
	// Unblocking a key that is not blocked says so and changes nothing (it
	// once said the key was reset).
	if _, err := s.limiter.Allow(ctx, "tenant-1"); err != nil {
		t.Fatal(err)
	}
	before, err := s.limiter.Peek(ctx, "tenant-1")
	if err != nil {
		t.Fatal(err)
	}
	status, body := s.post(t, action("action", "unblock", "name", "partner-api", "key", "tenant-1"), nil)
	after, err := s.limiter.Peek(ctx, "tenant-1")
	if err != nil {
		t.Fatal(err)
	}
	if status != 200 || !strings.Contains(body, "was not blocked: nothing changed") || after.Remaining != before.Remaining {
		t.Errorf("unblocking a key not blocked: %d %s, %d left before and %d after; want it said, nothing changed", status, body, before.Remaining, after.Remaining)
	}
}

func TestNewRefusesBadOptions(t *testing.T) {
	tgt := redistest.Embedded(t)
	for name, opts := range map[string][]dashboard.Option{
		"short token":    {dashboard.WithActions("short")},
		"braced prefix":  {dashboard.WithPrefix("a{}b")},
		"nil option":     {nil},
		"page size 0":    {dashboard.WithPageSize(0)},
		"no timeout":     {dashboard.WithTimeout(0)},
		"nil policy":     {dashboard.WithCodePolicies(map[string]throttle.Policy{"x": nil})},
		"invalid policy": {dashboard.WithCodePolicies(map[string]throttle.Policy{"x": throttle.GCRA{}})},
	} {
		if _, err := dashboard.New(tgt.Client, opts...); !errors.Is(err, dashboard.ErrInvalidOption) {
			t.Errorf("%s: New returned %v, want an error wrapping ErrInvalidOption", name, err)
		}
	}
	if _, err := dashboard.New(nil); !errors.Is(err, dashboard.ErrInvalidOption) {
		t.Errorf("nil client: New returned %v", err)
	}
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	defer ring.Close()
	if _, err := dashboard.New(ring); !errors.Is(err, dashboard.ErrInvalidOption) {
		t.Errorf("a Ring, which cannot be scanned: New returned %v", err)
	}
}
