package scan_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/internal/scan"
)

func TestGlobEscape(t *testing.T) {
	for in, want := range map[string]string{
		"throttle:":   "throttle:",
		"a*b?c[d]e\\": `a\*b\?c\[d\]e\\`,
		"":            "",
	} {
		if got := scan.GlobEscape(in); got != want {
			t.Errorf("GlobEscape(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestPrefixFindsEveryKeyOnce writes more keys than one SCAN call looks
// at, on every master of a Cluster when the target is one, plus a key
// whose name holds the glob's characters.
func TestPrefixFindsEveryKeyOnce(t *testing.T) {
	tgt := redistest.New(t)
	ctx := context.Background()
	var want []string
	for i := range 2500 {
		k := tgt.Prefix + "k:{" + string(rune('a'+i%26)) + "}" + time.Duration(i).String()
		want = append(want, k)
	}
	want = append(want, tgt.Prefix+"odd*[x]?\\")
	for _, k := range want {
		if err := tgt.Client.Set(ctx, k, "1", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	got, err := scan.Prefix(ctx, tgt.Client, tgt.Prefix, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("found %d keys, want %d", len(got), len(want))
	}
	odd, err := scan.Match(ctx, tgt.Client, scan.GlobEscape(tgt.Prefix+"odd*[x]?\\"), tgt.Prefix, 5*time.Second)
	if err != nil || len(odd) != 1 {
		t.Fatalf("Match of the escaped key = %q, %v; want it alone", odd, err)
	}
}
