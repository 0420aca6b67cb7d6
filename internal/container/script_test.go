package container

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/testutil"
	"github.com/gpucr/gpucr/internal/txn"
)

// scriptHost is an installed integration whose gpucr is a stand-in that appends each run's
// step to runs and exits with the status in the file exit (0 without it).
type scriptHost struct {
	in                Integration
	runs, exit, state string
}

func newScriptHost(t *testing.T) *scriptHost {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the script runs only a root-owned gpucr")
	}
	dir := t.TempDir()
	h := &scriptHost{runs: filepath.Join(dir, "runs"), exit: filepath.Join(dir, "exit"), state: filepath.Join(dir, "state")}
	fake := filepath.Join(t.TempDir(), "gpucr")
	// It also keeps, per step, what the state directory held while it ran.
	body := "#!/bin/sh\necho \"$CRTOOLS_SCRIPT_ACTION $*\" >> " + h.runs + "\nls " + h.state + " > " + h.runs + ".$CRTOOLS_SCRIPT_ACTION\n" +
		"[ -e " + h.exit + " ] && exit $(cat " + h.exit + ")\nexit 0\n"
	if err := os.WriteFile(fake, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	h.in = Integration{Config: filepath.Join(dir, "runc.conf"), Script: filepath.Join(dir, "lib", "criu-action"),
		Log: filepath.Join(dir, "action.log"), StateDir: h.state, Gpucr: fake}
	if err := h.in.Install(); err != nil {
		t.Fatal(err)
	}
	return h
}

// step runs the script as CRIU would for one step, with env added; this test process
// stands for CRIU, the script's parent.
func (h *scriptHost) step(t *testing.T, action string, env ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(h.in.Script)
	cmd.Env = append(append(os.Environ(), "CRTOOLS_SCRIPT_ACTION="+action), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// ran is the steps the stand-in gpucr ran, in order.
func (h *scriptHost) ran() []string {
	b, _ := os.ReadFile(h.runs)
	var steps []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			steps = append(steps, f[0])
		}
	}
	return steps
}

// holdingGPUDevice starts a tree whose child holds a file that reads as /dev/nvidiactl
// (in a mount namespace of its own: the host's /dev is left alone) and returns the root.
func holdingGPUDevice(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("sh", "-c", "unshare -m --propagation private sh -c 'mount -t tmpfs none /dev && : > /dev/nvidiactl && exec 3</dev/nvidiactl && exec sleep 60' & wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	root := cmd.Process.Pid
	t.Cleanup(func() {
		_ = syscall.Kill(-root, syscall.SIGKILL)
		_ = cmd.Wait() // killed: the status says nothing
	})
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", root, root))
		if f := strings.Fields(string(b)); len(f) > 0 {
			if l, _ := os.Readlink("/proc/" + f[0] + "/fd/3"); l == "/dev/nvidiactl" {
				return root
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("the stand-in GPU process did not open its device")
	return 0
}

// The script starts gpucr only for a dump whose tree holds a GPU device, a restore whose
// image has gpucr's GPU record, and the post-resume that pre-restore prepared; and once a
// step, CRIU running it twice.
func TestScriptStartsGpucrOnlyForGPUState(t *testing.T) {
	h := newScriptHost(t)
	cpu := testutil.StartSleeper(t).Process.Pid
	img := t.TempDir()
	env := func(init int) []string {
		return []string{"CRTOOLS_INIT_PID=" + strconv.Itoa(init), "CRTOOLS_IMAGE_DIR=" + img}
	}
	// An earlier dump's record in a reused image directory goes with the dump of a tree that
	// holds no GPU: a restore of the new image must not take it for the image's.
	testutil.WriteFile(t, filepath.Join(img, RecordName), []byte("{}"))
	for _, step := range []string{"pre-dump", "network-lock", "post-dump", "pre-restore", "post-restore", "pre-resume", "post-resume"} {
		for range 2 {
			if out, err := h.step(t, step, env(cpu)...); err != nil {
				t.Fatalf("%s: %v: %s", step, err, out)
			}
		}
		if _, err := os.Stat(filepath.Join(img, RecordName)); step == "pre-dump" && !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("the dump of a tree without GPU left an earlier dump's record: %v", err)
		}
	}
	if got := h.ran(); len(got) != 0 {
		t.Fatalf("gpucr started for a tree and an image without GPU state: %v", got)
	}

	gpuTree := holdingGPUDevice(t)
	for range 2 {
		if out, err := h.step(t, "pre-dump", env(gpuTree)...); err != nil {
			t.Fatalf("pre-dump: %v: %s", err, out)
		}
	}
	if err := os.WriteFile(filepath.Join(img, RecordName), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if out, err := h.step(t, "pre-restore", env(0)...); err != nil {
			t.Fatalf("pre-restore: %v: %s", err, out)
		}
	}
	// While gpucr ran a step, the step's mark was there (install-criu-integration --remove
	// waits on it): a hostile test's removal during a slow pre-restore broke the restore.
	self, err := proctree.Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []string{"pre-dump", "pre-restore"} {
		if b, _ := os.ReadFile(h.runs + "." + step); !strings.Contains(string(b), fmt.Sprintf("%d.%d.%s", self.PID, self.Start, step)) {
			t.Errorf("while gpucr ran %s the state directory held %q, not the step's mark", step, b)
		}
	}
	// What pre-restore keeps for post-resume, named by the CRIU that runs both, and one a
	// CRIU that was at this PID before left: never taken for this one's.
	criu, err := proctree.Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	testutil.WriteFile(t, filepath.Join(h.state, fmt.Sprintf("restore-%d.%d.json", criu.PID, criu.Start-1)), []byte("{}"))
	kept := filepath.Join(h.state, fmt.Sprintf("restore-%d.%d.json", criu.PID, criu.Start))
	if err := os.WriteFile(kept, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if out, err := h.step(t, "post-resume", env(cpu)...); err != nil {
			t.Fatalf("post-resume: %v: %s", err, out)
		}
		os.Remove(kept) // as gpucr's post-resume does
	}
	if got := strings.Join(h.ran(), " "); got != "pre-dump pre-restore post-resume" {
		t.Fatalf("gpucr ran for %q, want once for each step with GPU work", got)
	}
	if left, _ := filepath.Glob(filepath.Join(h.state, strconv.Itoa(os.Getpid())+".*")); len(left) != 0 {
		t.Errorf("the record of steps run outlives the restore: %v", left)
	}
	b, _ := os.ReadFile(h.runs)
	if !strings.Contains(string(b), "--state-dir "+h.state) || !strings.Contains(string(b), "--log "+h.in.Log) ||
		!strings.Contains(string(b), "--criu-pid "+strconv.Itoa(os.Getpid())) {
		t.Errorf("gpucr started with %q", b)
	}
	if out, err := h.step(t, "pre-dump", append(env(gpuTree), ActionSkipEnv+"=skip")...); err != nil || len(h.ran()) != 3 {
		t.Errorf("under %s=skip: %v %s, gpucr ran %v", ActionSkipEnv, err, out, h.ran())
	}
}

// A failed step fails both of CRIU's runs of the script, with gpucr run once.
func TestScriptRepeatsAFailureWithoutRunningAgain(t *testing.T) {
	h := newScriptHost(t)
	img := t.TempDir()
	if err := os.WriteFile(filepath.Join(img, RecordName), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(h.exit, []byte("3"), 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		_, err := h.step(t, "pre-restore", "CRTOOLS_IMAGE_DIR="+img)
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 3 {
			t.Fatalf("run %d of a failing pre-restore: %v, want exit 3", i+1, err)
		}
	}
	if got := h.ran(); len(got) != 1 {
		t.Fatalf("gpucr ran %v, want once", got)
	}
}

// fakeCRIU starts a shell named criu with args (in a directory of its own, where the
// script "page-server" reads stdin), with a pipe on its stdin that the test's end closes. The removal sees the machine's processes: it is
// tested only in the host's PID namespace.
func fakeCRIU(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	if host, err := proctree.InHostPIDNamespace(); err != nil || !host {
		t.Skip("needs the host's PID namespace, where --remove looks for CRIUs")
	}
	b, err := os.ReadFile("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	sh := filepath.Join(dir, "criu")
	testutil.WriteFile(t, sh, b)
	if err := os.Chmod(sh, 0o755); err != nil {
		t.Fatal(err)
	}
	// What `criu page-server` runs here: the shell reads its stdin.
	testutil.WriteFile(t, filepath.Join(dir, "page-server"), []byte("read x\n"))
	c := exec.Command(sh, args...)
	c.Dir = dir
	in, err := c.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(); _ = c.Process.Kill(); _ = c.Wait() })
	return c
}

// Removing the integration deletes the script only once no CRIU that may have read the
// configuration before it changed runs: one that read it, even before its first step,
// runs the script at its next steps, and a restore whose post-resume no longer finds it
// keeps running without its GPU state (a rolling update's removal could do that). A CRIU
// that has become a restored process (its name no longer criu) holds nothing up.
func TestRemoveWaitsForEveryCRIUThatMayHaveReadIt(t *testing.T) {
	h := newScriptHost(t)
	reading := fakeCRIU(t, "-c", "read x")
	restored := fakeCRIU(t, "-c", "printf workload > /proc/$$/comm; read x")
	// A page server runs no action script, and may run for long.
	fakeCRIU(t, "page-server")
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if p, err := proctree.Read(restored.Process.Pid); err == nil && p.Command == "workload" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the stand-in for a restored process did not take its name")
		}
	}
	removed := make(chan error, 1)
	go func() { _, err := h.in.Remove(); removed <- err }()
	time.Sleep(500 * time.Millisecond)
	if conf, err := os.ReadFile(h.in.Config); err == nil && strings.Contains(string(conf), h.in.Script) {
		t.Errorf("the configuration still names the script while Remove waits:\n%s", conf)
	}
	if _, err := os.Stat(h.in.Script); err != nil {
		t.Fatalf("the script was removed under a CRIU that may have read the configuration: %v", err)
	}
	_ = reading.Process.Kill()
	_ = reading.Wait()
	if err := <-removed; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(h.in.Script); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the script is still there: %v", err)
	}
}

// A CRIU that outlasts the wait keeps the script, and Remove says so; run again once it is
// gone, Remove finishes.
func TestRemoveKeepsTheScriptForACRIUThatRunsOn(t *testing.T) {
	h := newScriptHost(t)
	criu := fakeCRIU(t, "-c", "read x")
	defer func(d time.Duration) { removeWait = d }(removeWait)
	removeWait = 300 * time.Millisecond
	_, err := h.in.Remove()
	// Another CRIU of the machine (another package's tests) may be the one named.
	if err == nil || !strings.Contains(err.Error(), "CRIU (PID ") || !strings.Contains(err.Error(), "run again") {
		t.Fatalf("Remove under a CRIU that runs on: %v", err)
	}
	if _, err := os.Stat(h.in.Script); err != nil {
		t.Fatalf("the script was removed under a CRIU that runs on: %v", err)
	}
	_ = criu.Process.Kill()
	_ = criu.Wait()
	removeWait = 2 * time.Minute // for the CRIUs of other tests that may run meanwhile
	if _, err := h.in.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(h.in.Script); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the script is still there: %v", err)
	}
}

// CRIU's second run of pre-dump comes after gpucr's driver checkpoint, which closes the GPU
// processes' device files: it repeats the first run's status and leaves the record gpucr
// wrote in the image. On the GPU machine (device run 78) it took the tree for one without
// GPU, removed the record, and runc's restore then brought the container back without its
// GPU state; the fake driver of the CI tests leaves the files open, so only this test sees it.
func TestScriptSecondPreDumpKeepsTheRecord(t *testing.T) {
	h := newScriptHost(t)
	img := t.TempDir()
	tree := holdingGPUDevice(t)
	env := []string{"CRTOOLS_INIT_PID=" + strconv.Itoa(tree), "CRTOOLS_IMAGE_DIR=" + img}
	if out, err := h.step(t, "pre-dump", env...); err != nil {
		t.Fatalf("pre-dump: %v: %s", err, out)
	}
	record := filepath.Join(img, RecordName)
	testutil.WriteFile(t, record, []byte("{}")) // as gpucr's pre-dump writes it
	// The driver's checkpoint closes the device files: here, the process holding it goes.
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", tree, tree))
	holder, err := strconv.Atoi(strings.Fields(string(b))[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(holder, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.WaitGone(t, holder)
	if out, err := h.step(t, "pre-dump", env...); err != nil {
		t.Fatalf("the second pre-dump: %v: %s", err, out)
	}
	if _, err := os.Stat(record); err != nil {
		t.Fatalf("the second run of pre-dump removed this dump's record: %v", err)
	}
	if got := h.ran(); len(got) != 1 {
		t.Errorf("gpucr ran %v, want once", got)
	}
}

// Under umask 0 the script made the state directory's parents writable by all, and another
// user had root write over a file of their choosing through it (hostile test). What it
// makes is root's alone whatever the umask, and a state directory others can write is
// refused before gpucr starts.
func TestScriptKeepsItsStateRootsAlone(t *testing.T) {
	h := newScriptHost(t)
	deep := filepath.Join(t.TempDir(), "run", "gpucr", "criu-action")
	h.in.StateDir = deep
	if err := h.in.Install(); err != nil {
		t.Fatal(err)
	}
	env := []string{"CRTOOLS_INIT_PID=" + strconv.Itoa(holdingGPUDevice(t)), "CRTOOLS_IMAGE_DIR=" + t.TempDir()}
	old := syscall.Umask(0)
	out, err := h.step(t, "pre-dump", env...)
	syscall.Umask(old)
	if err != nil {
		t.Fatalf("pre-dump: %v: %s", err, out)
	}
	for _, d := range []string{filepath.Dir(filepath.Dir(deep)), filepath.Dir(deep), deep} {
		if fi, err := os.Stat(d); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v, %v; want 0700", d, fi.Mode(), err)
		}
	}
	// Another CRIU's dump (this one's marks gone), in a directory others can write.
	if err := os.RemoveAll(deep); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(deep), 0o777); err != nil {
		t.Fatal(err)
	}
	if out, err := h.step(t, "pre-dump", env...); err == nil || !strings.Contains(out, "not root's alone") {
		t.Fatalf("pre-dump with a state directory others can write: %v: %s", err, out)
	}
}

// Another user's process named criu reads no root configuration: --remove waited two
// minutes for one and kept the script (hostile test). Only root's CRIUs are waited for.
func TestRemoveWaitsForNoOtherUsersCRIU(t *testing.T) {
	h := newScriptHost(t)
	if host, err := proctree.InHostPIDNamespace(); err != nil || !host {
		t.Skip("needs the host's PID namespace, where --remove looks for CRIUs")
	}
	dir, err := os.MkdirTemp("", "gpucr-other-criu-") // one another user can reach
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/bin/sleep")
	if err != nil {
		t.Fatal(err)
	}
	fake := filepath.Join(dir, "criu")
	if err := os.WriteFile(fake, b, 0o755); err != nil {
		t.Fatal(err)
	}
	theirs := exec.Command(fake, "60")
	theirs.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if err := theirs.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = theirs.Process.Kill(); _ = theirs.Wait() }()
	defer func(d time.Duration) { removeWait = d }(removeWait)
	removeWait = time.Second
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if p, err := proctree.Read(theirs.Process.Pid); err == nil && p.Command == "criu" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the other user's criu did not start")
		}
	}
	_, err = h.in.Remove()
	if err != nil && strings.Contains(err.Error(), fmt.Sprintf("CRIU (PID %d)", theirs.Process.Pid)) {
		t.Fatalf("Remove waited for another user's process named criu: %v", err)
	}
}

// A root-owned link on the script's or the state directory's path (/usr/local is one on
// some distributions) was refused by the script's check, which read it as mode 777, though
// the installer accepted it: every GPU step then failed (review). A link is judged by its
// owner and where it leads; and a tree with a gpucr lock file but no GPU device open (its
// GPUs checkpointed by another operation) starts gpucr, which looks at the lock.
func TestScriptTakesRootsLinksAndLookAtLocks(t *testing.T) {
	h := newScriptHost(t)
	real := filepath.Join(t.TempDir(), "real")
	if err := os.Mkdir(real, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	h.in.StateDir = filepath.Join(link, "state")
	if err := h.in.Install(); err != nil {
		t.Fatal(err)
	}
	pid := testutil.StartSleeper(t).Process.Pid // no GPU device open
	env := []string{"CRTOOLS_INIT_PID=" + strconv.Itoa(pid), "CRTOOLS_IMAGE_DIR=" + t.TempDir()}
	lock := filepath.Join(txn.DefaultRoot, "locks", "pid-"+strconv.Itoa(pid)+".lock")
	if err := os.MkdirAll(filepath.Dir(lock), 0o700); err != nil {
		t.Fatal(err)
	}
	testutil.WriteFile(t, lock, nil)
	t.Cleanup(func() { _ = os.Remove(lock) })
	if out, err := h.step(t, "pre-dump", env...); err != nil {
		t.Fatalf("pre-dump through a root-owned link: %v: %s", err, out)
	}
	if got := h.ran(); !slices.Contains(got, "pre-dump") {
		t.Fatalf("gpucr not started for a tree with a lock file: ran %v", got)
	}
}
