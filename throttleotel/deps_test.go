package throttleotel_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestRootModuleHasNoOpenTelemetry: the library's own module graph holds
// no OpenTelemetry module, so its users who do not import throttleotel get
// none; this module's does, which shows that the check sees them.
func TestRootModuleHasNoOpenTelemetry(t *testing.T) {
	goBin, err := exec.LookPath("go") // go test puts its own go first on the PATH
	if err != nil {
		t.Fatalf("the go command is not on the PATH go test gives: %v", err)
	}
	for _, tc := range []struct {
		dir  string
		want bool
	}{{"..", false}, {".", true}} {
		cmd := exec.Command(goBin, "list", "-m", "all")
		cmd.Dir = tc.dir
		out, err := cmd.Output()
		if err != nil {
			var stderr string
			if exit, ok := err.(*exec.ExitError); ok {
				stderr = string(exit.Stderr)
			}
			t.Fatalf("go list -m all in %s: %v\n%s", tc.dir, err, stderr)
		}
		var otel []string
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "go.opentelemetry.io/") {
				otel = append(otel, line)
			}
		}
		if (len(otel) > 0) != tc.want {
			t.Errorf("module graph in %s: OpenTelemetry modules %v; want some: %v", tc.dir, otel, tc.want)
		}
	}
}
