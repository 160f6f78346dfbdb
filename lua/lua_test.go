package lua

import (
	"strings"
	"testing"
)

func TestSourceTakesOnlyTheHelpersAScriptCalls(t *testing.T) {
	// The meters' decision scripts are written out in full: no helper at
	// all, as each would be a closure made on every call.
	for name, script := range map[string]string{"GCRA": GCRA, "TokenBucket": TokenBucket} {
		if got := Source(script); strings.Contains(got, "local function ") {
			t.Errorf("the %s decision script defines helpers", name)
		}
	}
	booking := Source(MeterBooking)
	for _, used := range []string{"local function reserve(", "local function cancel(", "local function block(", "local function load_state(", "local function blocked_for("} {
		if !strings.Contains(booking, used) {
			t.Errorf("the booking script lacks %q, which it needs", used)
		}
	}
	fixed := Source(FixedWindow)
	for _, used := range []string{"local function server_now(", "local function load_state(", "local function floor_div("} {
		if !strings.Contains(fixed, used) {
			t.Errorf("the fixed-window script lacks %q, which it needs", used)
		}
	}
	for _, unused := range []string{"local function reserve(", "local function ticks_until(", "local function meter_reply("} {
		if strings.Contains(fixed, unused) {
			t.Errorf("the fixed-window script carries %q, which it never calls", unused)
		}
	}
	if !strings.HasPrefix(fixed, commonOpening) || !strings.HasSuffix(fixed, FixedWindow) {
		t.Error("a script is not the opening, its helpers and its own text")
	}
	if len(commonHelpers) < 10 {
		t.Fatalf("common.lua split into %d helpers", len(commonHelpers))
	}
}
