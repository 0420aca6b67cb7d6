package e2e

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/internal/engine"
)

// checkpoint --dry-run analyses and touches nothing: the workload keeps counting, no image
// is written; unknown or unskippable checks are bad requests.
func TestCheckpointDryRun(t *testing.T) {
	needCRIU(t)
	w := startCounter(t, "-child")
	w.waitCount(t, 2)
	var a engine.Analysis
	out := mustGpucr(t, "checkpoint", strconv.Itoa(w.pid), "--dry-run", "--json")
	if err := json.Unmarshal([]byte(out), &a); err != nil || a.Processes != 2 || a.Findings == nil || len(a.Findings) != 0 {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	if !strings.Contains(out, `"gpuProcesses": []`) { // a list, empty: null was what a machine reading it got
		t.Fatalf("dry run without GPU processes: %s", out)
	}
	if out := mustGpucr(t, "checkpoint", strconv.Itoa(w.pid), "--dry-run", "--skip-check", "multi-gpu-process"); !strings.Contains(out, "nothing found") {
		t.Fatalf("dry run text: %s", out)
	}
	for _, bad := range []string{"no-such-check", "io-uring"} {
		if out, code := gpucr(t, "checkpoint", strconv.Itoa(w.pid), "--dry-run", "--skip-check", bad); code != exitUsage {
			t.Fatalf("--skip-check %s: exit %d\n%s", bad, code, out)
		}
	}
	w.checkRunsOn(t, "a dry run")
}
