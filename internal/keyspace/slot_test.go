package keyspace

import "testing"

func TestHashTag(t *testing.T) {
	for _, c := range []struct{ key, tag string }{
		{"throttle:gcra@a:{tenant}", "tenant"},
		{"throttle:{jobs}:gcra@a:{tenant}", "jobs"},
		{"plain", "plain"},
		{"a{}b{c}", "a{}b{c}"}, // an empty first tag: the whole key
		{"a{b", "a{b"},
		{"a}b{c}", "c"},
		{"{x}", "x"},
	} {
		if got := HashTag(c.key); got != c.tag {
			t.Errorf("HashTag(%q) = %q, want %q", c.key, got, c.tag)
		}
	}
	if !OneSlot("p:{jobs}:a:{t1}", "p:{jobs}:b:{t2}:block") || OneSlot("p:a:{t1}", "p:a:{t2}") || !OneSlot() || !OneSlot("x") {
		t.Error("OneSlot: wrong answer")
	}
}

func TestCheckPrefix(t *testing.T) {
	for _, c := range []struct {
		prefix string
		ok     bool
	}{
		{"", true},
		{"throttle:", true},
		{"throttle:{jobs}:", true},
		{"{j}", true},
		{"throttle:{}:", false},
		{"throttle:{jobs:", false},
		{"throttle:jobs}:", false},
		{"}jobs{", false},
		{"{a}{b}", false},
		{"{a{b}", false},
		{"{a}b}", false},
	} {
		if err := CheckPrefix(c.prefix); (err == nil) != c.ok {
			t.Errorf("CheckPrefix(%q) = %v, want ok %v", c.prefix, err, c.ok)
		}
	}
}
