package launch

import (
	"context"
	"io"
	"testing"
	"time"
)

// When a rank fails the others are told to stop, and one that ignores it is killed after
// the grace: a hostile test's rank that trapped SIGTERM held the launcher for good.
func TestAFailedRankStopsTheOthers(t *testing.T) {
	defer func(d time.Duration) { stopGrace = d }(stopGrace)
	stopGrace = 300 * time.Millisecond
	script := `trap '' TERM; if [ "$RANK" = 0 ]; then sleep 0.2; exit 3; fi; exec sleep 60`
	start := time.Now()
	code, err := Run(context.Background(), Job{NProc: 2, Command: []string{"sh", "-c", script}, Stdout: io.Discard, Stderr: io.Discard})
	if err != nil || code != 3 {
		t.Fatalf("Run = %d, %v; want the failed rank's exit code 3", code, err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("Run took %v: the rank that ignored SIGTERM was not killed", took)
	}
}
