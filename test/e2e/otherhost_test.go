package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/testutil"
)

// These tests move a checkpoint to "another node": a restore run inside new mount, UTS,
// network and PID namespaces (unshare) whose hostname, files and PIDs differ from those the
// tree was checkpointed under. The image goes through a local store (checkpoint --to,
// restore --from), as it would between two nodes.

// onNode runs script with sh inside new mount, UTS, network and PID namespaces, /proc
// mounted for them, the hostname node2 and loopback up (CRIU needs it), and returns what
// it printed. $GPUCR is the binary. The namespaces, and whatever the script restored into
// them, end with it; a script still running after a minute is killed.
func onNode(t *testing.T, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", "--mount", "--uts", "--net", "--pid", "--fork", "--kill-child", "--mount-proc",
		"sh", "-c", "hostname node2 && ip link set lo up && "+script)
	cmd.Env = append(os.Environ(), "GPUCR="+bin.gpucr)
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("on the second node: %v\n%s", err, out)
	}
	return string(out)
}

// field returns the text after "name=" on its line of out.
func field(t *testing.T, out, name string) string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(l, name+"="); ok {
			return v
		}
	}
	t.Fatalf("no %s= in:\n%s", name, out)
	return ""
}

// A process tree of the host's namespaces, holding a data file open, moves to a node where
// the file is missing, then where its PID is taken: each restore is refused before anything
// runs, with one line that names what is wrong and what to do. Once both are put right it
// restores there, with the node's hostname and network, its file open again.
func TestRestoreOnAnotherNode(t *testing.T) {
	needCRIU(t)
	data := filepath.Join(t.TempDir(), "input")
	testutil.WriteFile(t, data, []byte("weights"))
	f, err := os.Open(data)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	job := exec.Command("sleep", "1000")
	job.ExtraFiles = []*os.File{f} // fd 3
	job.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := job.Start(); err != nil {
		t.Fatal(err)
	}
	pid := job.Process.Pid
	go job.Wait() //nolint:errcheck // reaps it once CRIU has killed it
	t.Cleanup(func() { testutil.KillAndReap(pid) })
	store := filepath.Join(t.TempDir(), "store")
	mustGpucr(t, "checkpoint", strconv.Itoa(pid), "--to", store)
	testutil.WaitGone(t, pid)

	out := onNode(t, fmt.Sprintf(`
mount -t tmpfs none %[1]s
echo missing-file:; $GPUCR restore --from %[2]s; echo code=$?
umount %[1]s
echo %[3]d > /proc/sys/kernel/ns_last_pid; sleep 100 & echo holder=$!
echo pid-taken:; $GPUCR restore --from %[2]s; echo code=$?
kill $!; wait $! 2>/dev/null
$GPUCR restore --from %[2]s >/dev/null && echo restored=yes
echo fd=$(readlink /proc/%[4]d/fd/3)
echo uts=$(readlink /proc/%[4]d/ns/uts) here=$(readlink /proc/self/ns/uts)
`, filepath.Dir(data), store, pid-1, pid))

	missing, taken, _ := strings.Cut(out, "pid-taken:")
	if !strings.Contains(missing, "code=1") || !strings.Contains(missing,
		fmt.Sprintf("a file the image needs is missing on this host: %s, open in PID %d (sleep) as fd 3; provide it at that path", data, pid)) {
		t.Errorf("restore without %s:\n%s", data, missing)
	}
	if field(t, out, "holder") != strconv.Itoa(pid) {
		t.Fatalf("the node's holder did not get PID %d:\n%s", pid, out)
	}
	if !strings.Contains(taken, "code=1") || !strings.Contains(taken,
		fmt.Sprintf(`PID %d (sleep in the image) is held by "sleep" (PID %d); stop it: the image's processes get their PIDs back`, pid, pid)) {
		t.Errorf("restore onto a taken PID:\n%s", taken)
	}
	if field(t, out, "restored") != "yes" || field(t, out, "fd") != data {
		t.Errorf("restore once both were put right:\n%s", out)
	}
	if uts := field(t, out, "uts"); !strings.HasSuffix(uts, "here="+strings.Fields(uts)[0]) {
		t.Errorf("the restored tree is not in the node's UTS namespace: %s", uts)
	}
}

// A tree that is the first of its own PID, UTS and network namespaces (as unshare or a
// pod's sandbox makes them) moves to a node where the host PID it had is taken: CRIU
// restores its namespaces whole, so nothing of the node's clashes. Its hostname comes with
// it, it counts on from where it stopped, and its memory, filled from the store, is intact.
func TestRestoreATreeOfItsOwnNamespacesOnAnotherNode(t *testing.T) {
	needCRIU(t)
	dir := t.TempDir()
	job := exec.Command("unshare", "--pid", "--uts", "--net", "--fork", "setsid", "sh", "-c",
		"hostname node1 && exec "+bin.counter+" -dir "+dir+" -tick 20ms -mib 64")
	if err := job.Start(); err != nil {
		t.Fatal(err)
	}
	w := &workload{dir: dir}
	w.waitCount(t, 3)
	kids, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", job.Process.Pid, job.Process.Pid))
	if err != nil || len(strings.Fields(string(kids))) != 1 {
		t.Fatalf("unshare's children: %q, %v", kids, err)
	}
	pid, _ := strconv.Atoi(strings.Fields(string(kids))[0])
	t.Cleanup(func() { testutil.KillAndReap(pid); _ = job.Process.Kill(); _ = job.Wait() })
	store := filepath.Join(t.TempDir(), "store")
	mustGpucr(t, "checkpoint", strconv.Itoa(pid), "--to", store)
	testutil.WaitGone(t, pid)
	frozen := w.read(t, "count")

	out := onNode(t, fmt.Sprintf(`
echo %[1]d > /proc/sys/kernel/ns_last_pid; sleep 100 & echo holder=$!
root=$($GPUCR restore --json --from %[2]s | sed -n 's/^  "rootPid": \([0-9]*\),/\1/p')
echo root=$root
echo hostname=$(nsenter -t "$root" -u hostname)
echo nspid=$(grep NSpid /proc/"$root"/status | tr -s '\t ' ' ')
timeout 20 sh -c 'while [ "$(cut -d" " -f1 %[3]s/count)" -le %[4]d ]; do sleep 0.02; done'
kill -USR1 "$root"
timeout 20 sh -c 'while [ ! -s %[3]s/verify ]; do sleep 0.02; done'
echo verify=$(cut -d' ' -f1 %[3]s/verify)
`, pid-1, store, dir, frozen))
	if field(t, out, "holder") != strconv.Itoa(pid) {
		t.Fatalf("the node's holder did not get PID %d:\n%s", pid, out)
	}
	if root := field(t, out, "root"); root == "" || root == strconv.Itoa(pid) {
		t.Fatalf("restore on a node where PID %d is taken: root %q:\n%s", pid, root, out)
	}
	if got := field(t, out, "hostname"); got != "node1" {
		t.Errorf("the restored tree's hostname is %q, want its own node1", got)
	}
	if nspid := field(t, out, "nspid"); !strings.HasSuffix(nspid, " 1") {
		t.Errorf("the restored root is not PID 1 of its namespace: %s", nspid)
	}
	if got := field(t, out, "verify"); got != "ok" {
		t.Errorf("the restored counter's memory: %s", got)
	}
}

// A tree with a mount namespace of its own is refused before anything is frozen: CRIU would
// dump it, and its image could not come back as a process tree.
func TestCheckpointRefusesATreeOfItsOwnMountNamespace(t *testing.T) {
	needCRIU(t)
	pid := testutil.StartUnsharedSleeper(t, "--mount", "--pid")
	out, code := gpucr(t, "checkpoint", strconv.Itoa(pid), "--to", filepath.Join(t.TempDir(), "store"))
	if code != exitUsage || !oneLineWith(out, fmt.Sprintf("PID %d has a mount namespace of its own", pid)) {
		t.Errorf("exit %d, want %d with one line naming the mount namespace:\n%s", code, exitUsage, out)
	}
	if !testutil.Alive(pid) {
		t.Error("the refused tree did not run on")
	}
}

// A root that its launcher set to die with it (unshare --kill-child) would be killed the
// moment CRIU, its parent in a restore, exits: the restore is refused before it starts.
func TestRestoreRefusesARootThatDiesWithItsParent(t *testing.T) {
	needCRIU(t)
	pid := testutil.StartUnsharedSleeper(t, "--pid", "--kill-child")
	dir := filepath.Join(t.TempDir(), "img")
	mustGpucr(t, "checkpoint", strconv.Itoa(pid), "-D", dir)
	out, code := gpucr(t, "restore", "-D", dir)
	if code != exitFailed || !oneLineWith(out, "PID 1 (sleep), asked for signal 9 when its parent dies") {
		t.Errorf("exit %d, want %d with one line naming the parent-death signal:\n%s", code, exitFailed, out)
	}
}

// A tree with a process below its root in a mount, network or cgroup namespace of its own (a job
// step under unshare, bwrap, a container tool) is refused before anything is frozen: CRIU
// dumped it and the tree was gone, then could not restore a sub-task in a namespace of its
// own, and the job was lost (hostile test).
func TestCheckpointRefusesATreeWithAChildInItsOwnNamespace(t *testing.T) {
	needCRIU(t)
	for kind, flag := range map[string]string{"mount": "--mount", "network": "--net", "cgroup": "--cgroup"} {
		t.Run(kind, func(t *testing.T) {
			cmd := exec.Command("setsid", "sh", "-c", "unshare "+flag+" sleep 1000 & wait")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			pid := cmd.Process.Pid
			t.Cleanup(func() {
				_ = syscall.Kill(-pid, syscall.SIGKILL)
				_ = cmd.Wait()
			})
			child := waitDescendant(t, pid, "sleep")
			out, code := gpucr(t, "checkpoint", strconv.Itoa(pid), "-D", filepath.Join(t.TempDir(), "img"))
			if code != exitUsage || !oneLineWith(out, fmt.Sprintf("process %d (sleep) of the tree has a %s namespace of its own", child, kind)) {
				t.Errorf("exit %d, want %d with one line naming the child's %s namespace:\n%s", code, exitUsage, kind, out)
			}
			if !testutil.Alive(pid) || !testutil.Alive(child) {
				t.Error("the refused tree did not run on")
			}
		})
	}
}

// waitDescendant waits for pid to have a descendant running command, and returns its PID.
// It looks below the children: a shell between them (script(1) under SHELL=/bin/sh runs
// dash, which forks the command rather than exec it) is no error.
func waitDescendant(t *testing.T, pid int, command string) int {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if c := descendant(pid, func(c int) bool { return commOf(c) == command }); c > 0 {
			return c
		}
	}
	t.Fatalf("process %d never ran %s", pid, command)
	return 0
}

// A subreaper root whose child called setsid, forked and exited holds that grandchild in a
// session whose leader is gone: CRIU restored it under PID 1, outside the tree, and the next
// checkpoint of the root left it behind (hostile test). Refused before anything is frozen.
func TestCheckpointRefusesAProcessInALeaderlessSession(t *testing.T) {
	needCRIU(t)
	script := `import ctypes, os, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(1000)
    os._exit(0)
os.waitpid(pid, 0)
time.sleep(1000)
`
	root := exec.Command("setsid", "python3", "-c", script)
	if err := root.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range proctree.Children(root.Process.Pid) {
			_ = syscall.Kill(c, syscall.SIGKILL)
		}
		_ = root.Process.Kill()
		_ = root.Wait()
	})
	var grandchild int
	for deadline := time.Now().Add(10 * time.Second); grandchild == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for _, c := range proctree.Children(root.Process.Pid) {
			if p, err := proctree.Read(c); err == nil && p.Session != p.PID && p.Session != root.Process.Pid {
				grandchild = c
			}
		}
	}
	if grandchild == 0 {
		t.Fatal("the grandchild never came under the root")
	}
	out, code := gpucr(t, "checkpoint", strconv.Itoa(root.Process.Pid), "-D", filepath.Join(t.TempDir(), "img"))
	if code != exitUsage || !oneLineWith(out, fmt.Sprintf("process %d (python3) of the tree is in session", grandchild)) {
		t.Errorf("exit %d, want %d with one line naming the leaderless session:\n%s", code, exitUsage, out)
	}
	if !testutil.Alive(root.Process.Pid) || !testutil.Alive(grandchild) {
		t.Error("the refused tree did not run on")
	}
}
