package proctree

import (
	"os"
	"testing"

	"github.com/gpucr/gpucr/internal/testutil"
)

// A process that is the first of its own PID namespace is PID 1 there, and the tree rooted
// at it maps back to its host PID; a process of gpucr's own namespaces has none of its own.
func TestNamespacesOfAnUnsharedProcess(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "unshare needs root")
	}
	pid := testutil.StartUnsharedSleeper(t, "--pid", "--uts")
	if in, err := InnerPID(pid); err != nil || in != 1 {
		t.Errorf("InnerPID(%d) = %d, %v; want 1", pid, in, err)
	}
	if host, err := HostPIDs(pid); err != nil || len(host) != 1 || host[1] != pid {
		t.Errorf("HostPIDs(%d) = %v, %v; want 1 -> %d", pid, host, err, pid)
	}
	for kind, want := range map[string]bool{"pid": true, "uts": true, "mnt": false, "net": false} {
		if own, err := OwnNamespace(pid, kind); err != nil || own != want {
			t.Errorf("OwnNamespace(%d, %s) = %v, %v; want %v", pid, kind, own, err, want)
		}
	}
	if in, err := InnerPID(os.Getpid()); err != nil || in != os.Getpid() {
		t.Errorf("InnerPID(self) = %d, %v; want %d", in, err, os.Getpid())
	}
}
