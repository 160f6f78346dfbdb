package dashboard_test

import (
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jobthrottle/jobthrottle/dashboard"
)

// apiDocs reads docs/dashboard.md's read API: the fields of each table
// under a "### " heading of "The read API", by heading, and which of them
// may be left out of an answer ("left out when").
func apiDocs(t *testing.T) (fields map[string][]string, optional map[string]bool) {
	t.Helper()
	text, err := os.ReadFile("../docs/dashboard.md")
	if err != nil {
		t.Fatal(err)
	}
	start := strings.Index(string(text), "## The read API")
	if start < 0 {
		t.Fatal("docs/dashboard.md has no section \"The read API\"")
	}
	section := string(text)[start:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	fields, optional = map[string][]string{}, map[string]bool{}
	row := regexp.MustCompile("^\\| `([A-Za-z]+)` \\|")
	heading := ""
	for _, line := range strings.Split(section, "\n") {
		if h, ok := strings.CutPrefix(line, "### "); ok {
			heading = h
			continue
		}
		if m := row.FindStringSubmatch(line); m != nil && heading != "" {
			fields[heading] = append(fields[heading], m[1])
			if strings.Contains(line, "left out when") {
				optional[heading+"."+m[1]] = true
			}
		}
	}
	return fields, optional
}

// TestReadAPIMatchesItsDocs: every field of every answer of the read API,
// and of the limiter, key and bookings objects in them, is documented in
// docs/dashboard.md, and every documented field is in the answers (but
// those documented as left out, when they are), on a fleet's real keys.
func TestReadAPIMatchesItsDocs(t *testing.T) {
	s := newSite(t)
	docs, optional := apiDocs(t)
	check := func(heading string, got map[string]any) {
		t.Helper()
		want := docs[heading]
		if len(want) == 0 {
			t.Errorf("docs/dashboard.md documents no field under %q", heading)
			return
		}
		for _, f := range want {
			if _, ok := got[f]; !ok && !optional[heading+"."+f] {
				t.Errorf("%s: documented field %q is not in the answer %v", heading, f, slices.Sorted(maps.Keys(got)))
			}
		}
		for f := range got {
			if !slices.Contains(want, f) {
				t.Errorf("%s: field %q of the answer is not documented", heading, f)
			}
		}
	}
	get := func(path string) map[string]any {
		t.Helper()
		var v map[string]any
		s.getJSON(t, "/ops/api/"+path, &v)
		if v["apiVersion"] != float64(dashboard.APIVersion) {
			t.Errorf("api/%s: apiVersion %v, want %d", path, v["apiVersion"], dashboard.APIVersion)
		}
		return v
	}
	overview := get("overview")
	check("GET api/overview", overview)
	check("A limiter", overview["limiters"].([]any)[0].(map[string]any))
	limiter := get("limiter?" + q("name", "partner-api"))
	check("GET api/limiter?name=NAME", limiter)
	check("A limiter", limiter["limiter"].(map[string]any))
	check("A key", limiter["hottest"].([]any)[0].(map[string]any))
	check("GET api/keys?name=NAME&prefix=P&sort=held|admitted|key&page=N", get("keys?"+q("name", "partner-api")))
	key := get("key?" + q("name", "partner-api", "key", "tenant-1"))
	check("GET api/key?name=NAME&key=KEY", key)
	check("A key", key["state"].(map[string]any))
	check("Bookings", key["bookings"].(map[string]any))
	check("Shares", key["shares"].(map[string]any))
	check("GET api/series?name=NAME[&key=KEY][&since=UNIX]", get("series?"+q("name", "partner-api")))
}
