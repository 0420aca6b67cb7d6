package container

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/internal/testutil"
	"github.com/gpucr/gpucr/internal/txn"
)

// The hierarchies a watcher leaves are those it is below the root of, found by what
// /proc/self/cgroup names them: cgroup2's, and v1's by controllers or name=.
func TestCgroupRootsAreTheHierarchiesOneIsBelow(t *testing.T) {
	own := "9:name=systemd:/system.slice/x.service\n8:pids:/system.slice/x.service\n4:memory:/\n1:cpu,cpuacct:/a\n0::/system.slice/x.service\n"
	mountinfo := strings.Join([]string{
		"30 25 0:26 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate",
		"31 25 0:27 / /sys/fs/cgroup/systemd rw,nosuid - cgroup cgroup rw,xattr,name=systemd",
		"32 25 0:28 / /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids",
		"33 25 0:29 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory",
		"34 25 0:30 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct",
		"35 25 0:31 /sub /sys/fs/cgroup/freezer rw,nosuid - cgroup cgroup rw,freezer",
		"36 25 0:32 / /proc rw - proc proc rw",
	}, "\n")
	got := cgroupRoots(own, mountinfo)
	slices.Sort(got)
	want := []string{"/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/pids", "/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified"}
	if !slices.Equal(got, want) {
		t.Fatalf("cgroupRoots = %q, want %q", got, want)
	}
}

// A watcher in its caller's cgroup died when the caller cleaned it up once runc returned
// (a systemd unit), and the job it was to resume stayed stopped on its GPU (hostile test):
// it leaves for the root.
func TestWatcherLeavesItsCallersCgroup(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "moving between cgroups needs root")
	}
	top := ""
	for _, d := range []string{"/sys/fs/cgroup/pids", "/sys/fs/cgroup"} {
		if _, err := os.Stat(filepath.Join(d, "cgroup.procs")); err == nil {
			top = d
			break
		}
	}
	if top == "" {
		testutil.SkipOrFail(t, "no cgroup hierarchy mounted")
	}
	child := filepath.Join(top, "gpucr-test-watcher-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(child, 0o755); err != nil {
		testutil.SkipOrFail(t, "make a cgroup: "+err.Error())
	}
	t.Cleanup(func() { _ = os.Remove(child) })
	watcher := exec.Command(os.Args[0], "-test.run=^$")
	watcher.Env = append(os.Environ(), "GPUCR_TEST_LEAVE_CGROUPS=1")
	in, err := watcher.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := watcher.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := watcher.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = watcher.Process.Kill(); _ = watcher.Wait() }()
	pid := strconv.Itoa(watcher.Process.Pid)
	if err := os.WriteFile(filepath.Join(child, "cgroup.procs"), []byte(pid), 0); err != nil {
		testutil.SkipOrFail(t, "join a cgroup: "+err.Error())
	}
	_, _ = in.Write([]byte("go\n"))
	if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(child, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(strings.Fields(string(b)), pid) {
		t.Fatalf("the watcher is still in %s", child)
	}
}

// A watcher lets go of the locks it inherited once its rollback is done, and removes
// their files while they are still the ones held: left, a file per process per dump
// stayed behind, and every later dump of those PIDs started gpucr for them.
func TestWatcherReleasesItsLocks(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "the journal's locks are root's")
	}
	root := t.TempDir()
	l, err := txn.LockTarget(root, "pid-1234", "a dump")
	if err != nil {
		t.Fatal(err)
	}
	// As the watcher has it: descriptor 4, after the CRIU pidfd on 3.
	if err := unix.Dup2(int(l.File().Fd()), watchFD+1); err != nil {
		t.Fatal(err)
	}
	_ = l.File().Close()
	ReleaseInheritedLocks(1)
	if _, err := os.Stat(filepath.Join(root, "locks", "pid-1234.lock")); !os.IsNotExist(err) {
		t.Errorf("the lock file is left: %v", err)
	}
	again, err := txn.LockTarget(root, "pid-1234", "gpucr")
	if err != nil {
		t.Fatalf("the lock once released: %v", err)
	}
	again.Release()
}
