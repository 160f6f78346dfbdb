package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestAssembledScriptsAreCurrent(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	want, err := outputs(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(want) < 15 {
		t.Fatalf("found %d scripts, want every limiter's, the worker's and the scheduler's", len(want))
	}
	for path, text := range want {
		got, err := os.ReadFile(path)
		if err != nil || string(got) != string(text) {
			t.Errorf("%s is not current: run go generate ./lua/", path)
		}
	}
	for _, dir := range dirs {
		present, _ := filepath.Glob(filepath.Join(root, dir, assembledDir, "*.lua"))
		for _, path := range present {
			if _, ok := want[path]; !ok {
				t.Errorf("%s has no source: run go generate ./lua/", path)
			}
		}
	}
}

func TestAssembleTakesWhatAScriptUses(t *testing.T) {
	common := strings.Join([]string{
		"-- opening",
		"local MODE = 1",
		"",
		"-- a is used by b only",
		"local function a(x)",
		"  return x",
		"end",
		"",
		"-- b calls a",
		"local function b(x)",
		"  return a(x) + 1",
		"end",
		"",
		"-- c is passed as a value, never called by name",
		"local function c(x)",
		"  return x * 2",
		"end",
		"",
		"-- d is named in the script's comment only",
		"local function d(x)",
		"  return x",
		"end",
		"",
		"-- e calls itself and nothing else",
		"local function e(x)",
		"  if x > 0 then return e(x - 1) end",
		"  return 0",
		"end",
		"",
	}, "\n")
	body := "-- uses d? no: d is only mentioned here\nlocal f = c\nreturn b(1) + f(2)\n"
	got := assemble(common, body)
	defined := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^local function (\w+)`).FindAllStringSubmatch(got, -1) {
		defined[m[1]] = true
	}
	for name, want := range map[string]bool{"a": true, "b": true, "c": true, "d": false, "e": false} {
		if defined[name] != want {
			t.Errorf("helper %s included: %v, want %v", name, defined[name], want)
		}
	}
	if !strings.HasPrefix(got, "-- opening\nlocal MODE = 1\n") || !strings.HasSuffix(got, "\n"+body) {
		t.Errorf("not the opening, the helpers, then the script:\n%s", got)
	}
	if strings.Index(got, "local function a(") > strings.Index(got, "local function b(") {
		t.Error("helpers out of common.lua's order")
	}
}
