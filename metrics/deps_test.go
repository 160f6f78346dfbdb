package metrics_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoAsynqDependency: package metrics, for limiters and HTTP clients,
// must not pull in asynq or cron (nor the packages built on them); its
// subpackage workermetrics does, which shows that the check sees them.
func TestNoAsynqDependency(t *testing.T) {
	// go test puts the go command that runs it first on the PATH
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is not on the PATH go test gives: %v", err)
	}
	const metrics, workermetrics = "github.com/jobthrottle/jobthrottle/metrics", "github.com/jobthrottle/jobthrottle/metrics/workermetrics"
	out, err := exec.Command(goBin, "list", "-f", `{{.ImportPath}} {{join .Deps " "}}`, metrics, workermetrics).Output()
	if err != nil {
		var stderr string
		if exit, ok := err.(*exec.ExitError); ok {
			stderr = string(exit.Stderr)
		}
		t.Fatalf("go list: %v\n%s", err, stderr)
	}
	deps := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		deps[fields[0]] = fields[1:]
	}
	forbidden := []string{"github.com/hibiken/asynq", "github.com/robfig/cron",
		"github.com/jobthrottle/jobthrottle/worker", "github.com/jobthrottle/jobthrottle/scheduler"}
	offending := func(pkg string) []string {
		var found []string
		for _, d := range deps[pkg] {
			for _, f := range forbidden {
				if d == f || strings.HasPrefix(d, f+"/") {
					found = append(found, d)
				}
			}
		}
		return found
	}
	if len(deps[metrics]) == 0 || len(deps[workermetrics]) == 0 {
		t.Fatalf("go list gave no dependencies: %q", out)
	}
	if found := offending(metrics); len(found) > 0 {
		t.Errorf("%s depends on %v", metrics, found)
	}
	if found := offending(workermetrics); len(found) == 0 {
		t.Errorf("%s does not depend on asynq: the check finds nothing", workermetrics)
	}
}
