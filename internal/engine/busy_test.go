package engine

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/internal/txn"
)

// A lock held by a killed gpucr's guardian, while it rolls that gpucr's work back, named
// the dead gpucr and told the user to wait for it to finish (crash test): the refusal says
// to retry in a moment. A lock whose gpucr lives still says to wait.
func TestBusyRefusalSaysWhetherItsGpucrIsGone(t *testing.T) {
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		pid  int
		want string
	}{{gone.Process.Pid, "that gpucr is gone"}, {1, "wait for it to finish"}} {
		root := t.TempDir()
		l, err := txn.LockTarget(root, PIDLock(4242), fmt.Sprintf(holderText, c.pid, txn.OpRestore, "PID 4242"))
		if err != nil {
			t.Fatal(err)
		}
		_, err = (&Engine{JournalRoot: root}).Begin(txn.OpCheckpoint, "PID 4242", PIDLock(4242))
		l.Release()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("holder PID %d: %v, want it to say %q", c.pid, err, c.want)
		}
	}
}
