package engine

import (
	"errors"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/internal/testutil"
)

// A target that is no process to checkpoint is named as what it is, before anything
// begins: a thread, a zombie, or a tree with a traced process (CRIU's own failure named
// only a firewall rule it could not remove; hostile test).
func TestOpenNamesWhatCannotBeCheckpointed(t *testing.T) {
	e := &Engine{}
	open := func(pid int) error { _, err := e.Tree(pid).Open(t.Context()); return err }

	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		if tid, _ := strconv.Atoi(task.Name()); tid != os.Getpid() {
			if err := open(tid); !errors.Is(err, ErrBadTarget) || !strings.Contains(err.Error(), "is a thread of process "+strconv.Itoa(os.Getpid())) {
				t.Errorf("a thread: %v", err)
			}
			break
		}
	}

	exited := exec.Command("true")
	if err := exited.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = exited.Wait() }()
	zombie := func() error { return open(exited.Process.Pid) }
	err = zombie()
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(errString(err), "has exited") && time.Now().Before(deadline); err = zombie() {
		time.Sleep(10 * time.Millisecond) // until true has exited
	}
	if !errors.Is(err, ErrBadTarget) || !strings.Contains(err.Error(), "has exited") {
		t.Errorf("a zombie: %v", err)
	}

	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "tracing another process needs root here")
	}
	traced := testutil.StartSleeper(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.PtraceSeize(traced.Process.Pid); err != nil {
		testutil.SkipOrFail(t, "ptrace: "+err.Error())
	}
	if err := open(traced.Process.Pid); !errors.Is(err, ErrBadTarget) || !strings.Contains(err.Error(), "is traced by PID") {
		t.Errorf("a traced process: %v", err)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
