package e2e

import (
	"encoding/json"
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

	"github.com/gpucr/gpucr/internal/hwbreak"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/testutil"
	"github.com/gpucr/gpucr/internal/txn"
)

// crashHost is what a killed gpucr may leave behind: its journal and locks, and a THP
// switch of its own that starts at madvise.
type crashHost struct {
	run, thp string
}

func newCrashHost(t *testing.T) crashHost {
	t.Helper()
	h := crashHost{run: t.TempDir(), thp: filepath.Join(t.TempDir(), "thp")}
	if err := os.WriteFile(h.thp, []byte("always [madvise] never\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h crashHost) flags() []string { return []string{"--run-dir", h.run, "--thp-switch", h.thp} }

// checkClean waits for the guardian to finish the rollback and fails t if anything of the
// operation is left: a journal record, a lock, THP changed.
func (h crashHost) checkClean(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ops, err := txn.List(h.run)
		if err != nil {
			t.Fatal(err)
		}
		locks, _ := filepath.Glob(filepath.Join(h.run, "*", "*.lock"))
		if len(ops) == 0 && len(locks) == 0 {
			break
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(h.run, "recovery.log"))
			t.Fatalf("after 30 s the journal holds %+v, locks %v\n%s", ops, locks, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if b, _ := os.ReadFile(h.thp); strings.TrimSpace(string(b)) != "madvise" && !strings.Contains(string(b), "[madvise]") {
		t.Errorf("THP switch is %q, want madvise back", b)
	}
}

// untraced fails t if CRIU still holds pid.
func untraced(t *testing.T, pid int) {
	t.Helper()
	if tr, err := proctree.Tracer(pid); err == nil && tr != 0 {
		t.Errorf("PID %d is still traced by %d", pid, tr)
	}
}

// onlyImages fails t if dir's parent holds anything but a complete image at dir.
func onlyImages(t *testing.T, dir string) {
	t.Helper()
	entries, _ := os.ReadDir(filepath.Dir(dir))
	for _, e := range entries {
		if e.Name() != filepath.Base(dir) {
			t.Errorf("left beside the image: %s", e.Name())
		}
	}
	if _, err := os.Stat(dir); err == nil {
		mustGpucr(t, "verify", dir) // only a committed image may be there, and whole
	}
}

// crashSetup starts a counter that the fake driver holds as a GPU process, on a host of
// its own, and names the image directory to use.
func crashSetup(t *testing.T, drv *fakeDriver) (crashHost, *workload, string) {
	t.Helper()
	host := newCrashHost(t)
	w := startCounter(t, "-mib", "16", "-gpu-state", drv.dir)
	drv.claim(t, w.pid)
	return host, w, filepath.Join(t.TempDir(), "img")
}

// killedAt runs gpucr with args, armed to kill itself at point, and fails t unless it died so.
func killedAt(t *testing.T, point string, env []string, args ...string) {
	t.Helper()
	env = append(slices.Clone(env), "GPUCR_TEST_CRASH_AT="+point)
	if out, errOut, code := gpucrEnv(t, env, args...); code != -1 {
		t.Fatalf("gpucr was not killed at %q: exit %d\n%s%s", point, code, out, errOut)
	}
}

// Points in a checkpoint where gpucr is killed: every phase's boundaries, and inside the
// driver's checkpoint (made slow) and the commit.
var checkpointCrashes = []string{
	"begin", "start gpu-lock", "end gpu-lock", "start gpu-checkpoint", "start gpu-checkpoint+150ms", "end gpu-checkpoint",
	"start criu-dump", "end criu-dump", "start memory-save", "end memory-save", "start commit", "in commit", "end commit",
}

func TestKilledCheckpointRollsBack(t *testing.T) {
	needCRIU(t)
	drv := newFakeDriver(t)
	for _, point := range checkpointCrashes {
		t.Run(point, func(t *testing.T) {
			host, w, dir := crashSetup(t, drv)
			killedAt(t, point, append([]string{"FAKECUDA_CHECKPOINT_MS=400"}, drv.env...), append([]string{"checkpoint", strconv.Itoa(w.pid), "-D", dir}, host.flags()...)...)
			host.checkClean(t)
			untraced(t, w.pid)
			if st := drv.state(w.pid); st != "0" {
				t.Fatalf("GPU state %s after the rollback, want 0 (running)", st)
			}
			w.checkRunsOn(t, "gpucr was killed at "+point)
			onlyImages(t, dir)
		})
	}
}

// With the image on a tmpfs and the GPU processes holding device memory, the checkpoint
// allocates the image's memory ahead while the driver stages (memfill.Reserve). Killed
// while it allocates, while the save takes it, or after, gpucr leaves the workload running
// and nothing of the reserve: no image, or a whole one; and a checkpoint not killed leaves
// no reserve in its image either.
func TestKilledCheckpointIntoReservedMemoryRollsBack(t *testing.T) {
	needCRIU(t)
	drv := newFakeDriver(t)
	env := append([]string{"FAKECUDA_CHECKPOINT_MS=400", "FAKENVML_PROCESS_MEMORY=" + strconv.Itoa(512<<20)}, drv.env...)
	for _, point := range []string{"start gpu-checkpoint+150ms", "start memory-save", "end memory-save", "end commit", ""} {
		t.Run("killed at "+point, func(t *testing.T) {
			host, w, _ := crashSetup(t, drv)
			shm, err := os.MkdirTemp("/dev/shm", "gpucr-e2e-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(shm) })
			dir := filepath.Join(shm, "img")
			args := append([]string{"checkpoint", strconv.Itoa(w.pid), "-D", dir, "--leave-running"}, host.flags()...)
			if point == "" {
				mustGpucrEnv(t, env, args...)
			} else {
				killedAt(t, point, env, args...)
			}
			host.checkClean(t)
			untraced(t, w.pid)
			if st := drv.state(w.pid); st != "0" {
				t.Fatalf("GPU state %s, want 0 (running)", st)
			}
			w.checkRunsOn(t, "gpucr was killed at "+point)
			onlyImages(t, dir)
			if _, err := os.Stat(filepath.Join(dir, ".gpucr-reserve")); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("the reserved memory is left in the image: %v", err)
			}
			if _, err := os.Stat(dir); point == "" && err != nil {
				t.Fatalf("no image after the checkpoint: %v", err)
			}
		})
	}
}

// A periodic checkpoint lets its workload run again before the image is durable: killed
// anywhere from there, gpucr leaves the workload running on its GPU and no image, or a
// whole one.
func TestKilledPeriodicCheckpointLeavesTheWorkloadRunning(t *testing.T) {
	needCRIU(t)
	drv := newFakeDriver(t)
	for _, point := range []string{"end memory-save", "start commit", "in commit", "start gpu-resume", "end commit"} {
		t.Run(point, func(t *testing.T) {
			host, w, dir := crashSetup(t, drv)
			killedAt(t, point, drv.env, append([]string{"checkpoint", strconv.Itoa(w.pid), "-D", dir, "--leave-running"}, host.flags()...)...)
			host.checkClean(t)
			untraced(t, w.pid)
			if st := drv.state(w.pid); st != "0" {
				t.Fatalf("GPU state %s after gpucr died at %s, want 0 (running)", st, point)
			}
			w.checkRunsOn(t, "gpucr was killed at "+point)
			onlyImages(t, dir)
		})
	}
}

// Points in a restore where gpucr is killed.
var restoreCrashes = []string{
	"begin", "start criu-restore", "in criu-restore", "start memory-fill", "end memory-fill",
	"resuming", "end criu-restore", "start gpu-restore", "end gpu-restore",
}

func TestKilledRestoreLeavesNothingOrAWholeWorkload(t *testing.T) {
	needCRIU(t)
	drv := newFakeDriver(t)
	for _, point := range restoreCrashes {
		t.Run(point, func(t *testing.T) {
			host, w, dir := crashSetup(t, drv)
			mustGpucrEnv(t, drv.env, append([]string{"checkpoint", strconv.Itoa(w.pid), "-D", dir}, host.flags()...)...)
			testutil.WaitGone(t, w.pid)
			frozen := w.read(t, "count")
			killedAt(t, point, drv.env, append([]string{"restore", "-D", dir}, host.flags()...)...)
			host.checkClean(t)
			t.Cleanup(func() { testutil.KillAndReap(w.pid) })
			if point == "resuming" && !testutil.Alive(w.pid) {
				// Journaled whole as CRIU lets the tasks go: CRIU, in a process group of its
				// own, outlives gpucr and lets them go, and the guardian finishes the restore.
				t.Fatal("the restore, whole when gpucr died, was not finished")
			}
			if !testutil.Alive(w.pid) {
				// Nothing running: the image restores as if nothing had happened, once the
				// killed tasks are reaped (by us: the subreaper they were left to).
				testutil.WaitReaped(t, w.pid)
				mustGpucrEnv(t, drv.env, append([]string{"restore", "-D", dir}, host.flags()...)...)
			}
			untraced(t, w.pid)
			if st := drv.state(w.pid); st != "0" {
				t.Fatalf("restored process's GPU state is %s, want 0 (running)", st)
			}
			if c := w.waitCount(t, frozen+3); c < frozen {
				t.Fatalf("count went back: %d < %d", c, frozen)
			}
			if v := w.verify(t, w.pid); v != "ok" {
				t.Fatalf("memory after the restore: %s", v)
			}
		})
	}
}

func TestTwoOperationsOnOneProcessExcludeEachOther(t *testing.T) {
	needCRIU(t)
	drv := newFakeDriver(t)
	host := newCrashHost(t)
	w := startCounter(t, "-mib", "16", "-gpu-state", drv.dir)
	drv.claim(t, w.pid)
	// The first checkpoint is held in the driver's (slowed) checkpoint while a second starts.
	first := exec.Command(bin.gpucr, append([]string{"checkpoint", strconv.Itoa(w.pid), "-D", filepath.Join(t.TempDir(), "a"), "--leave-running"}, host.flags()...)...)
	first.Env = append(append(os.Environ(), drv.env...), "FAKECUDA_CHECKPOINT_MS=1500")
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for ops, _ := txn.List(host.run); len(ops) == 0 && time.Now().Before(deadline); ops, _ = txn.List(host.run) {
		time.Sleep(10 * time.Millisecond)
	}
	out, errOut, code := gpucrEnv(t, drv.env, append([]string{"checkpoint", strconv.Itoa(w.pid), "-D", filepath.Join(t.TempDir(), "b")}, host.flags()...)...)
	if code != 1 || !strings.Contains(errOut, "another gpucr operation is in progress") || !strings.Contains(errOut, "checkpoint of PID "+strconv.Itoa(w.pid)) {
		t.Errorf("second checkpoint: exit %d\n%s%s", code, out, errOut)
	}
	if err := first.Wait(); err != nil {
		t.Fatalf("first checkpoint: %v", err)
	}
	host.checkClean(t)
	w.checkRunsOn(t, "two checkpoints at once")
}

// One lock per process: while a checkpoint of a tree runs, an operation on any process
// of it (here its child, the GPU process) is refused, not interleaved.
func TestOperationOnAProcessOfABusyTreeIsRefused(t *testing.T) {
	needCRIU(t)
	drv := newFakeDriver(t)
	host := newCrashHost(t)
	w := startCounter(t, "-mib", "16", "-child")
	var child int
	for deadline := time.Now().Add(5 * time.Second); child == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if tree, err := proctree.Tree(w.pid); err == nil && len(tree) > 1 {
			child = tree[1].PID
		}
	}
	if child == 0 {
		t.Fatal("the counter's child did not start")
	}
	drv.claim(t, child)
	first := exec.Command(bin.gpucr, append([]string{"checkpoint", strconv.Itoa(w.pid), "-D", filepath.Join(t.TempDir(), "a"), "--leave-running"}, host.flags()...)...)
	first.Env = append(append(os.Environ(), drv.env...), "FAKECUDA_CHECKPOINT_MS=1500")
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if drv.state(child) != "0" {
			break // the first checkpoint holds the child's GPU
		}
	}
	out, errOut, code := gpucrEnv(t, drv.env, append([]string{"checkpoint", strconv.Itoa(child), "-D", filepath.Join(t.TempDir(), "b")}, host.flags()...)...)
	if code != 1 || !strings.Contains(errOut, "another gpucr operation is in progress") || !strings.Contains(errOut, "checkpoint of PID "+strconv.Itoa(w.pid)) {
		t.Errorf("checkpoint of the child: exit %d\n%s%s", code, out, errOut)
	}
	if err := first.Wait(); err != nil {
		t.Fatalf("first checkpoint: %v", err)
	}
	host.checkClean(t)
	if st := drv.state(child); st != "0" {
		t.Fatalf("child's GPU state %s, want 0", st)
	}
	w.checkRunsOn(t, "a checkpoint of its child refused")
}

// checkJSON is what gpucr check --json reports on host, with the fake driver.
func checkJSON(t *testing.T, drv *fakeDriver, host crashHost) checkDoc {
	t.Helper()
	var check checkDoc
	out, _, _ := gpucrEnv(t, drv.env, append([]string{"check", "--json"}, host.flags()...)...)
	if err := json.Unmarshal([]byte(out), &check); err != nil {
		t.Fatalf("check --json: %v\n%s", err, out)
	}
	return check
}

func TestRecoverFinishesWhatGuardianAndGpucrLeft(t *testing.T) {
	needCRIU(t)
	drv := newFakeDriver(t)
	host := newCrashHost(t)
	w := startCounter(t, "-gpu-state", drv.dir)
	drv.claim(t, w.pid)
	// A gpucr killed together with its guardian leaves a checkpointed process and a stale
	// record; the record is what a real kill leaves, written here by hand.
	img := filepath.Join(t.TempDir(), "img")
	mustGpucrEnv(t, drv.env, append([]string{"checkpoint", strconv.Itoa(w.pid), "-D", img, "--leave-running"}, host.flags()...)...)
	if err := os.WriteFile(filepath.Join(drv.dir, strconv.Itoa(w.pid)), []byte("2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	self, _ := txn.ProcOf(w.pid)
	rec := txn.Record{ID: "checkpoint-0123456789ab", Op: txn.OpCheckpoint, Target: "PID " + strconv.Itoa(w.pid),
		Owner: txn.Proc{PID: 999999, Start: 1}, Phase: "gpu-checkpoint", Tree: []txn.Proc{self},
		GPUs: []txn.GPUProc{{Backend: "nvidia", Proc: self}}, THP: &txn.Setting{Path: host.thp, Old: "madvise"}}
	if err := os.WriteFile(host.thp, []byte("[always] madvise never\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A gpucr killed after its commit renamed the image into place, before the journal said
	// so: its image is complete, and recover says so instead of "rolled back".
	done := txn.Record{ID: "checkpoint-ba9876543210", Op: txn.OpCheckpoint, Target: "PID 1234567",
		Owner: txn.Proc{PID: 999998, Start: 1}, Phase: "commit", Paths: []string{image.StagingPath(img, "checkpoint-ba9876543210")}}
	for _, r := range []txn.Record{rec, done} {
		b, _ := json.Marshal(r)
		if err := os.WriteFile(filepath.Join(host.run, "txn", r.ID+".json"), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	check := checkJSON(t, drv, host)
	if len(check.Operations) != 2 || check.Operations[0].Held {
		t.Errorf("check lists operations %+v, want the two stale ones", check.Operations)
	}
	out := mustGpucrEnv(t, drv.env, append([]string{"recover"}, host.flags()...)...)
	if !strings.Contains(out, "rolled back the checkpoint of PID "+strconv.Itoa(w.pid)) ||
		!strings.Contains(out, "finished the checkpoint of PID 1234567: its image was complete") {
		t.Errorf("recover said: %s", out)
	}
	mustGpucr(t, "verify", img)
	host.checkClean(t)
	if st := drv.state(w.pid); st != "0" {
		t.Fatalf("GPU state %s after recover, want 0", st)
	}
	w.checkRunsOn(t, "gpucr recover")
}

func TestCheckListsAndRecoverResumesAStrandedProcess(t *testing.T) {
	needCRIU(t)
	drv := newFakeDriver(t)
	host := newCrashHost(t)
	w := startCounter(t, "-gpu-state", drv.dir)
	drv.claim(t, w.pid)
	// Checkpointed by another tool, or a gpucr older than its journal: no record names it.
	if err := os.WriteFile(filepath.Join(drv.dir, strconv.Itoa(w.pid)), []byte("2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	check := checkJSON(t, drv, host)
	if len(check.Stranded) != 1 || check.Stranded[0] != w.pid {
		t.Errorf("check lists stranded %v, want [%d]", check.Stranded, w.pid)
	}
	mustGpucrEnv(t, drv.env, append([]string{"recover", "--pid", strconv.Itoa(w.pid)}, host.flags()...)...)
	if st := drv.state(w.pid); st != "0" {
		t.Fatalf("GPU state %s after recover --pid, want 0", st)
	}
	w.checkRunsOn(t, "gpucr recover --pid")
}

func TestKilledContainerCheckpointRollsBack(t *testing.T) {
	needRunc(t)
	drv := newFakeDriver(t)
	for _, point := range []string{"begin", "end gpu-checkpoint", "start criu-dump", "end criu-dump", "in commit", "end commit"} {
		t.Run(point, func(t *testing.T) {
			host := newCrashHost(t)
			runc, bundle, id, _ := counterContainer(t, strings.ReplaceAll(point, " ", "-"))
			pid := runcInitPID(t, runc, id)
			drv.claim(t, pid)
			dir := filepath.Join(t.TempDir(), "img")
			killedAt(t, point, drv.env, append([]string{"checkpoint", "--container", id, "-D", dir}, host.flags()...)...)
			host.checkClean(t)
			if st := drv.state(pid); st != "0" {
				t.Fatalf("GPU state %s after the rollback, want 0 (running)", st)
			}
			waitContainerCount(t, bundle, count(t, bundle)+3) // running, not left paused
			onlyImages(t, dir)
		})
	}
}

// gpucr killed while its runc pause starts: the guardian's resume found the container not
// yet frozen, running, and said it was rolled back; the pause then froze it for good (crash
// test: 1 of 16 kills a few milliseconds after the GPU checkpoint). runc pause dies with
// gpucr. Here runc is slow between opening its log (through gpucr's descriptor, at its
// start) and freezing: a wrapper opens the log and waits before it runs runc.
func TestContainerCheckpointKilledInItsPauseRunsOn(t *testing.T) {
	runc, _ := needRunc(t)
	drv := newFakeDriver(t)
	host := newCrashHost(t)
	_, bundle, id, _ := counterContainer(t, "pausekill")
	pid := runcInitPID(t, runc, id)
	drv.claim(t, pid)
	wrapper := filepath.Join(t.TempDir(), "runc")
	script := fmt.Sprintf("#!/bin/sh\ncase \" $* \" in *\" pause \"*) exec 9>>\"$2\"; shift 2; sleep 2; exec %s --log /proc/self/fd/9 \"$@\" ;; esac\nexec %s \"$@\"\n", runc, runc)
	if err := os.WriteFile(wrapper, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "img")
	killedAt(t, "end gpu-checkpoint+500ms", drv.env, append([]string{"checkpoint", "--container", id, "-D", dir, "--runc", wrapper}, host.flags()...)...)
	host.checkClean(t)
	time.Sleep(2 * time.Second) // the wrapper's pause, had it outlived gpucr, has frozen it
	if st, _ := hwbreak.Command(runc, "state", id).Output(); !strings.Contains(string(st), `"status": "running"`) {
		t.Fatalf("container not running after the rollback:\n%s", st)
	}
	if st := drv.state(pid); st != "0" {
		t.Fatalf("GPU state %s after the rollback, want 0 (running)", st)
	}
	waitContainerCount(t, bundle, count(t, bundle)+3)
	onlyImages(t, dir)
}

// runc killed on its own (the OOM killer, an admin; gpucr alive) while its CRIU dumps the
// paused container: the CRIU it leaves fails at its next word to runc and then puts the
// freezer back as it found it, frozen. gpucr's rollback had resumed the container before
// that, and it stayed paused for good, the rollback done (crash test: 3 of 6 kills). The
// rollback waits for that CRIU to end: the container runs on.
func TestContainerCheckpointWhoseRuncIsKilledRunsOn(t *testing.T) {
	needRunc(t)
	for _, leave := range []bool{false, true} {
		for _, delay := range []time.Duration{0, 5 * time.Millisecond, 30 * time.Millisecond} {
			t.Run(fmt.Sprintf("leave-running=%v,%v", leave, delay), func(t *testing.T) {
				host := newCrashHost(t)
				runc, bundle, id, _ := counterContainer(t, fmt.Sprintf("rk%v%d", leave, delay.Milliseconds()), "-mib", "64")
				pid := runcInitPID(t, runc, id)
				args := append([]string{"checkpoint", "--container", id, "-D", filepath.Join(t.TempDir(), "img")}, host.flags()...)
				if leave {
					args = append(args, "--leave-running")
				}
				cmd, out, done := startGpucr(t, args...)
				runcPID := 0
				for deadline := time.Now().Add(30 * time.Second); runcPID == 0 && time.Now().Before(deadline) && len(done) == 0; time.Sleep(100 * time.Microsecond) {
					if tr, err := proctree.Tracer(pid); err == nil && tr != 0 {
						runcPID = parentOf(tr) // CRIU's parent
					}
				}
				if runcPID == 0 {
					err := <-done
					if err == nil {
						t.Skip("the checkpoint was done before its CRIU was seen")
					}
					t.Fatalf("runc's CRIU never seized the container's init: %v %s", err, out.String())
				}
				if commOf(runcPID) != "runc" {
					t.Fatalf("the tracer of the container's init is not runc's CRIU (its parent %d is %s)", runcPID, commOf(runcPID))
				}
				time.Sleep(delay)
				if err := syscall.Kill(runcPID, syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				select {
				case err := <-done:
					if err == nil {
						t.Skip("the checkpoint was done before runc was killed")
					}
				case <-time.After(90 * time.Second):
					_ = cmd.Process.Kill()
					t.Fatal("gpucr still checkpointing 90 s after its runc was killed")
				}
				host.checkClean(t)
				for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
					if tr, err := proctree.Tracer(pid); err != nil || tr == 0 {
						break
					}
				}
				time.Sleep(500 * time.Millisecond) // a CRIU that freezes again has done so
				st, _ := hwbreak.Command(runc, "state", id).Output()
				if !strings.Contains(string(st), `"status": "running"`) {
					t.Fatalf("container not running after the failed checkpoint (%s): %s", out.String(), st)
				}
				waitContainerCount(t, bundle, count(t, bundle)+3)
			})
		}
	}
}

// integrationContainer is a GPU container (its init holding a fake device file, claimed by
// drv) started under plain runc with gpucr's CRIU integration installed in a directory of
// the test; name tells the test's containers apart.
type integrationContainer struct {
	runc, criu, bundle, id, log string
	pid                         int
}

func installIntegration(t *testing.T) (conf, log string) {
	t.Helper()
	tmp := t.TempDir()
	conf, log = filepath.Join(tmp, "runc.conf"), filepath.Join(tmp, "action.log")
	mustGpucr(t, "install-runc-integration", "--config", conf, "--script", filepath.Join(tmp, "criu-action"), "--log", log,
		"--state-dir", filepath.Join(tmp, "state"))
	return conf, log
}

func startIntegrationContainer(t *testing.T, drv *fakeDriver, conf, log, name string) integrationContainer {
	t.Helper()
	runc, criuPath := needRunc(t)
	c := integrationContainer{runc: runc, criu: criuPath, bundle: counterBundle(t, runc, conf), log: log}
	holdGPUDevice(t, c.bundle)
	c.id = containerID(t, runc, name)
	runcRun(t, runc, c.bundle, c.id)
	waitContainerCount(t, c.bundle, 3)
	c.pid = runcInitPID(t, runc, c.id)
	drv.claim(t, c.pid)
	return c
}

// checkpointLeavingRunning is plain `runc checkpoint --leave-running` of c, with env added.
func (c integrationContainer) checkpointLeavingRunning(t *testing.T, env []string) ([]byte, error) {
	ck := hwbreak.Command(c.runc, "--criu", c.criu, "checkpoint", "--image-path", filepath.Join(t.TempDir(), "img"),
		"--work-path", t.TempDir(), "--leave-running", c.id)
	ck.Env = append(ck.Env, env...)
	return ck.CombinedOutput()
}

// gpuRunsAgain waits up to 20 s for the GPU state of c's init to be running again, and
// fails t with the integration's log if it is not.
func (c integrationContainer) gpuRunsAgain(t *testing.T, drv *fakeDriver, after string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for drv.state(c.pid) != "0" && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if st := drv.state(c.pid); st != "0" {
		b, _ := os.ReadFile(c.log)
		t.Fatalf("GPU state %s %s, want 0 (running)\n%s", st, after, b)
	}
}

// Under plain runc, gpucr runs as CRIU's action script: killed inside its pre-dump step,
// CRIU aborts the dump (the script's second run repeats the first's failure), and the
// watcher the script started before locking gives the GPU processes back once CRIU exits.
// The container runs on.
func TestKilledActionScriptRollsBack(t *testing.T) {
	drv := newFakeDriver(t)
	conf, log := installIntegration(t)
	for _, point := range []string{"end gpu-lock", "end gpu-checkpoint", "end pre-dump"} {
		t.Run(point, func(t *testing.T) {
			c := startIntegrationContainer(t, drv, conf, log, strings.ReplaceAll(point, " ", "-"))
			if out, err := c.checkpointLeavingRunning(t, append(slices.Clone(drv.env), "GPUCR_TEST_CRASH_AT="+point)); err == nil {
				t.Fatalf("runc checkpoint succeeded though the action script was killed at %q: %s", point, out)
			}
			c.gpuRunsAgain(t, drv, "after the dump failed")
			b, _ := os.ReadFile(log)
			if !strings.Contains(string(b), "gpuProcesses=") || strings.Contains(string(b), "gpuProcesses=0") {
				t.Errorf("the action script found no GPU process; its log:\n%s", b)
			}
			waitContainerCount(t, c.bundle, count(t, c.bundle)+3)
		})
	}
}

// gpucr restore --container killed at each phase: afterwards the container runs whole (its
// memory verified and filled, counting on) or does not exist and the image restores again;
// no runc, CRIU or hook waits on, and nothing of the restore is left.
func TestKilledContainerRestoreLeavesNothingOrAWholeContainer(t *testing.T) {
	needRunc(t)
	for _, point := range []string{"begin", "start criu-restore", "start criu-restore+120ms", "end criu-restore", "end"} {
		t.Run(point, func(t *testing.T) {
			host := newCrashHost(t)
			tmp := t.TempDir()
			env := []string{"TMPDIR=" + tmp}
			runc, bundle, id, _ := counterContainer(t, strings.NewReplacer(" ", "-", "+", "-").Replace(point), "-mib", "32")
			dir := filepath.Join(t.TempDir(), "img")
			mustGpucr(t, append([]string{"checkpoint", "--container", id, "-D", dir}, host.flags()...)...)
			frozen := count(t, bundle)
			killedAt(t, point, env, append([]string{"restore", "--container", id, "-D", dir}, host.flags()...)...)
			host.checkClean(t)
			if gone(runc, id) {
				mustGpucrEnv(t, env, append([]string{"restore", "--container", id, "-D", dir}, host.flags()...)...)
			}
			checkCountsOn(t, bundle, frozen)
			if left, _ := filepath.Glob(filepath.Join(tmp, "gpucr-*")); len(left) > 0 {
				t.Errorf("left in TMPDIR: %v", left)
			}
			if out, _ := exec.Command("pgrep", "-f", "criu-action --post-restore").Output(); len(out) > 0 {
				t.Errorf("post-restore hooks still running: %s", out)
			}
		})
	}
}

// containerd and CRI-O pause a container before they have runc dump it; the GPU driver
// waits on a process that does not run (the fake driver too, for 10 s). The action script
// thaws it for the GPU step and leaves it paused, and once the engine resumes it, the
// watcher gives the GPU state back to the container left running.
func TestActionScriptCheckpointsAPausedContainer(t *testing.T) {
	drv := newFakeDriver(t)
	conf, log := installIntegration(t)
	c := startIntegrationContainer(t, drv, conf, log, "paused")
	if out, err := hwbreak.Command(c.runc, "pause", c.id).CombinedOutput(); err != nil {
		t.Fatalf("runc pause: %v: %s", err, out)
	}
	out, err := c.checkpointLeavingRunning(t, drv.env)
	b, _ := os.ReadFile(log)
	if err != nil {
		t.Fatalf("runc checkpoint of a paused GPU container: %v: %s\n%s", err, out, b)
	}
	if !strings.Contains(string(b), "thawed for the GPU driver") || !strings.Contains(string(b), "GPU state checkpointed") {
		t.Fatalf("the action script did not thaw and checkpoint the GPU state; its log:\n%s", b)
	}
	if st, err := hwbreak.Command(c.runc, "state", c.id).Output(); err != nil || !strings.Contains(string(st), `"paused"`) {
		t.Fatalf("container not left paused as the engine paused it: %v %s", err, st)
	}
	if out, err := hwbreak.Command(c.runc, "resume", c.id).CombinedOutput(); err != nil {
		t.Fatalf("runc resume: %v: %s", err, out)
	}
	c.gpuRunsAgain(t, drv, "once the engine resumed the container")
	waitContainerCount(t, c.bundle, count(t, c.bundle)+3)
}

// A restore that copies CRIU's files to a private directory (the image's criu/ is writable
// by all) and is killed before, in and after CRIU's restore leaves nothing of the copy in
// $TMPDIR once its guardian (or the next gpucr) has recovered, and restores again.
func TestKilledRestoreFromAPrivateCopyLeavesNoCopy(t *testing.T) {
	needCRIU(t)
	drv := newFakeDriver(t)
	for _, point := range []string{"begin", "start criu-restore", "end criu-restore"} {
		t.Run(point, func(t *testing.T) {
			host, w, dir := crashSetup(t, drv)
			mustGpucrEnv(t, drv.env, append([]string{"checkpoint", strconv.Itoa(w.pid), "-D", dir}, host.flags()...)...)
			testutil.WaitGone(t, w.pid)
			if err := os.Chmod(filepath.Join(dir, "criu"), 0o777); err != nil {
				t.Fatal(err)
			}
			tmp := t.TempDir()
			env := append([]string{"TMPDIR=" + tmp}, drv.env...)
			killedAt(t, point, env, append([]string{"restore", "-D", dir}, host.flags()...)...)
			host.checkClean(t)
			t.Cleanup(func() { testutil.KillAndReap(w.pid) })
			gpucrEnv(t, env, append([]string{"recover"}, host.flags()...)...) // a staging record left before the restore began
			if left, _ := filepath.Glob(filepath.Join(tmp, "gpucr-image-*")); len(left) > 0 {
				t.Fatalf("the private copy outlived the killed restore: %v", left)
			}
			if !testutil.Alive(w.pid) {
				testutil.WaitReaped(t, w.pid)
				mustGpucrEnv(t, env, append([]string{"restore", "-D", dir}, host.flags()...)...)
			}
			if v := w.verify(t, w.pid); v != "ok" {
				t.Fatalf("memory after the restore: %s", v)
			}
		})
	}
}

// A restore's journal names the processes it made by PID and start time only once they
// exist; until then its PIDs are the image's, and nothing shows that a process there is the
// restore's. recover kills neither such a process nor one that took a journaled PID since
// (a hostile test had recover SIGKILL nobody's process at a PID the dead restore had named).
func TestRecoverSparesAProcessAtAJournaledPID(t *testing.T) {
	needCRIU(t)
	host := newCrashHost(t)
	unproven, reused := testutil.StartSleeper(t), testutil.StartSleeper(t)
	was, err := txn.ProcOf(reused.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	was.Start-- // the process the restore made there, gone since
	if err := os.MkdirAll(filepath.Join(host.run, "txn"), 0o700); err != nil {
		t.Fatal(err)
	}
	for i, tree := range [][]txn.Proc{{{PID: unproven.Process.Pid}}, {was}} {
		rec := txn.Record{ID: fmt.Sprintf("restore-%012d", i), Op: txn.OpRestore, Target: "image /nowhere",
			Owner: txn.Proc{PID: 999999, Start: 1}, Phase: "criu-restore", Tree: tree}
		b, _ := json.Marshal(rec)
		if err := os.WriteFile(filepath.Join(host.run, "txn", rec.ID+".json"), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out := mustGpucr(t, append([]string{"recover"}, host.flags()...)...)
	if strings.Count(out, "rolled back the restore") != 2 {
		t.Errorf("recover said: %s", out)
	}
	for _, p := range []*exec.Cmd{unproven, reused} {
		if !testutil.Alive(p.Process.Pid) {
			t.Errorf("recover killed process %d, which the dead restore had not shown to be its own", p.Process.Pid)
		}
	}
	host.checkClean(t)
}

// A periodic checkpoint resumes its workload's GPU through a driver whose restore fails
// for a moment: tried again, the workload runs on. A hostile test had the first failure
// end the checkpoint with the workload left checkpointed on its GPU, frozen, while stdout
// said it was left running.
func TestLeftRunningThroughAFailingResume(t *testing.T) {
	needCRIU(t)
	drv := newFakeDriver(t)
	_, w, dir := crashSetup(t, drv)
	out := mustGpucrEnv(t, append([]string{"FAKECUDA_RESTORE_FAILS=1"}, drv.env...), "checkpoint", strconv.Itoa(w.pid), "-D", dir, "--leave-running")
	if !strings.Contains(out, "left running") {
		t.Errorf("the output does not say the tree was left running:\n%s", out)
	}
	if st := drv.state(w.pid); st != "0" {
		t.Fatalf("GPU state %s after the checkpoint, want 0 (running)", st)
	}
	w.checkRunsOn(t, "a checkpoint whose first GPU resume failed")
	mustGpucr(t, "verify", dir)
}

// A driver that keeps failing the resume: the checkpoint says, in its last line, how to
// bring the workload back, claims no tree left running, and that way brings it back.
func TestLeftRunningThroughAResumeThatKeepsFailing(t *testing.T) {
	needCRIU(t)
	drv := newFakeDriver(t)
	_, w, dir := crashSetup(t, drv)
	out, errOut, code := gpucrEnv(t, append([]string{"FAKECUDA_RESTORE_FAILS=1000000"}, drv.env...), "checkpoint", strconv.Itoa(w.pid), "-D", dir, "--leave-running")
	hint := fmt.Sprintf("gpucr recover --pid %d", w.pid)
	if code == 0 || strings.Contains(out, "left running") || !oneLineWith(errOut, hint) {
		t.Fatalf("exit %d, want a failure naming %q and no tree said left running:\n%s%s", code, hint, out, errOut)
	}
	mustGpucrEnv(t, drv.env, "recover", "--pid", strconv.Itoa(w.pid))
	if st := drv.state(w.pid); st != "0" {
		t.Fatalf("GPU state %s after gpucr recover, want 0 (running)", st)
	}
	w.checkRunsOn(t, "gpucr recover")
}

// CRIU killed on its own during a restore (the OOM killer, an admin), gpucr alive: CRIU
// kills what it made when it fails, not when it is killed, and its tasks stayed in its
// restorer, every signal blocked, holding the image's PIDs for good (crash test). gpucr
// removes them; the image restores again.
func TestRestoreWhoseCRIUIsKilledLeavesNothing(t *testing.T) {
	needCRIU(t)
	drv := newFakeDriver(t)
	host, w, dir := crashSetup(t, drv)
	mustGpucrEnv(t, drv.env, append([]string{"checkpoint", strconv.Itoa(w.pid), "-D", dir}, host.flags()...)...)
	testutil.WaitGone(t, w.pid)
	cmd := exec.Command(bin.gpucr, append([]string{"restore", "-D", dir}, host.flags()...)...)
	cmd.Env = append(os.Environ(), drv.env...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	for deadline := time.Now().Add(30 * time.Second); !killed && time.Now().Before(deadline); time.Sleep(100 * time.Microsecond) {
		// CRIU has forked the task at the image's PID: it is the task's parent.
		if ppid := parentOf(w.pid); ppid > 0 && ppid != cmd.Process.Pid {
			if commOf(ppid) == "criu" {
				killed = syscall.Kill(ppid, syscall.SIGKILL) == nil
			}
		}
	}
	err := cmd.Wait()
	if !killed {
		t.Fatalf("CRIU never forked the image's task (restore: %v)", err)
	}
	if err == nil {
		t.Skip("CRIU was killed after the restore was whole")
	}
	host.checkClean(t)
	testutil.WaitGone(t, w.pid)
	mustGpucrEnv(t, drv.env, append([]string{"restore", "-D", dir}, host.flags()...)...)
	t.Cleanup(func() { testutil.KillAndReap(w.pid) })
	if v := w.verify(t, w.pid); v != "ok" {
		t.Fatalf("memory after the second restore: %s", v)
	}
}

// parentOf is pid's parent's PID, 0 if pid is not there.
func parentOf(pid int) int {
	p, err := proctree.Read(pid)
	if err != nil {
		return 0
	}
	return p.PPID
}

// CRIU killed after the checkpoint committed its image (after its post-dump notification):
// gpucr said only "criu dump failed", and a script that removes DIR on failure would remove
// the job's only copy (crash test). The failure says the image is complete, and it is.
func TestCheckpointWhoseCRIUIsKilledAfterTheCommitSaysTheImageIsWhole(t *testing.T) {
	needCRIU(t)
	drv := newFakeDriver(t)
	host, w, dir := crashSetup(t, drv)
	cmd := exec.Command(bin.gpucr, append([]string{"checkpoint", strconv.Itoa(w.pid), "-D", dir}, host.flags()...)...)
	cmd.Env = append(os.Environ(), drv.env...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	for deadline := time.Now().Add(30 * time.Second); !killed && time.Now().Before(deadline); time.Sleep(50 * time.Microsecond) {
		if _, err := os.Stat(filepath.Join(dir, image.ManifestName)); err != nil {
			continue
		}
		for _, c := range proctree.Children(cmd.Process.Pid) {
			if commOf(c) == "criu" {
				killed = syscall.Kill(c, syscall.SIGKILL) == nil
			}
		}
	}
	err := cmd.Wait()
	t.Cleanup(func() { testutil.KillAndReap(w.pid) })
	if err == nil {
		t.Skip("CRIU was done before it could be killed")
	}
	if !killed || !oneLineWith(errOut.String(), "the image written to "+dir+" is complete, but CRIU failed after it was written") ||
		!strings.Contains(errOut.String(), filepath.Join(dir, "logs")) {
		t.Fatalf("checkpoint whose CRIU was killed after the commit: %v\n%s%s", err, out.String(), errOut.String())
	}
	host.checkClean(t)
	mustGpucr(t, "verify", dir)
}

// A second checkpoint started while the first one's CRIU held the tree was told the tree
// was traced and to detach the tracer: killing that CRIU is the one thing that loses the
// job (crash test). It is told another operation holds the tree.
func TestASecondCheckpointDuringTheDumpIsToldToWait(t *testing.T) {
	needCRIU(t)
	host := newCrashHost(t)
	w := startCounter(t, "-random-mib", "256")
	w.waitCount(t, 2)
	first := exec.Command(bin.gpucr, append([]string{"checkpoint", strconv.Itoa(w.pid), "-D", filepath.Join(t.TempDir(), "a"), "--leave-running"}, host.flags()...)...)
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if tracer, err := proctree.Tracer(w.pid); err == nil && tracer != 0 {
			break
		}
	}
	out, errOut, code := gpucrEnv(t, nil, append([]string{"checkpoint", strconv.Itoa(w.pid), "-D", filepath.Join(t.TempDir(), "b")}, host.flags()...)...)
	if code == 0 || strings.Contains(errOut, "detach the tracer") || !strings.Contains(errOut, "another gpucr operation is in progress") {
		t.Errorf("second checkpoint during the first's dump: exit %d\n%s%s", code, out, errOut)
	}
	if err := first.Wait(); err != nil {
		t.Fatalf("first checkpoint: %v", err)
	}
	host.checkClean(t)
	w.checkRunsOn(t, "two checkpoints at once")
}

// A container restore whose CRIU (runc's child) is killed on its own once it has forked the
// container's init, at a few delays after: the init was left in CRIU's restorer, or running
// outside any container beside a later restore of the image, and gpucr now and then waited
// for good on runc (crash test). gpucr must fail within bounds, leave no process in the
// container's cgroup and no container, and the image must restore again.
func TestContainerRestoreWhoseCRIUIsKilledLeavesNothing(t *testing.T) {
	needRunc(t)
	// Killed a while after its first fork, or at post-restore (its hook, gpucr, running:
	// every task made, none resumed).
	type point struct {
		child string
		delay time.Duration
	}
	for _, p := range []point{{"", 0}, {"", 20 * time.Millisecond}, {"", 80 * time.Millisecond}, {"", 120 * time.Millisecond}, {"gpucr", 0}, {"gpucr", 10 * time.Millisecond}, {"gpucr", 30 * time.Millisecond}, {"gpucr", 60 * time.Millisecond}} {
		delay := p.delay
		t.Run(p.child+delay.String(), func(t *testing.T) {
			host := newCrashHost(t)
			runc, bundle, id, _ := counterContainer(t, "ck"+p.child+strconv.Itoa(int(delay.Milliseconds())), "-mib", "32")
			dir := filepath.Join(t.TempDir(), "img")
			mustGpucr(t, append([]string{"checkpoint", "--container", id, "-D", dir}, host.flags()...)...)
			frozen := count(t, bundle)
			cmd, out, done := startGpucr(t, append([]string{"restore", "--container", id, "-D", dir}, host.flags()...)...)
			killed := false
			for deadline := time.Now().Add(30 * time.Second); !killed && time.Now().Before(deadline) && len(done) == 0; time.Sleep(200 * time.Microsecond) {
				if c := criuWithAChild(cmd.Process.Pid, p.child); c > 0 {
					time.Sleep(delay)
					killed = syscall.Kill(c, syscall.SIGKILL) == nil
				}
			}
			var err error
			select {
			case err = <-done:
			case <-time.After(90 * time.Second):
				_ = cmd.Process.Kill()
				t.Fatalf("gpucr still restoring 90 s after its CRIU was killed")
			}
			if err == nil {
				t.Skipf("CRIU was killed after the restore was whole, or never seen (killed: %v)", killed)
			}
			if !killed {
				t.Fatalf("the restore failed with its CRIU never killed: %v: %s", err, out.String())
			}
			t.Logf("gpucr: %v: %s", err, out.String())
			host.checkClean(t)
			if !gone(runc, id) {
				t.Fatal("the failed restore left the container")
			}
			for deadline := time.Now().Add(5 * time.Second); len(inCgroupOf(id)) > 0; time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					var left []string
					for _, pid := range inCgroupOf(id) {
						p, _ := proctree.Read(pid)
						left = append(left, fmt.Sprintf("%d (%s, state %c, parent %d)", pid, p.Command, p.State, p.PPID))
						_ = syscall.Kill(pid, syscall.SIGKILL)
					}
					t.Fatalf("processes left in the container's cgroup, outside any container: %s", strings.Join(left, ", "))
				}
			}
			mustGpucr(t, append([]string{"restore", "--container", id, "-D", dir}, host.flags()...)...)
			checkCountsOn(t, bundle, frozen)
		})
	}
}

// criuWithAChild is a process named criu below pid that has a child (named child, unless
// ""), 0 if none. It walks down from pid: a scan of all of /proc missed the moment on a
// loaded host.
func criuWithAChild(pid int, child string) int {
	return descendant(pid, func(c int) bool {
		return commOf(c) == "criu" && slices.ContainsFunc(proctree.Children(c), func(k int) bool { return child == "" || commOf(k) == child })
	})
}

// descendant is the first process below pid, breadth first, that match takes; 0 if none.
func descendant(pid int, match func(int) bool) int {
	for queue := proctree.Children(pid); len(queue) > 0; queue = queue[1:] {
		if match(queue[0]) {
			return queue[0]
		}
		queue = append(queue, proctree.Children(queue[0])...)
	}
	return 0
}

// commOf is the command name of process pid, "" if it is gone.
func commOf(pid int) string {
	p, _ := proctree.Read(pid)
	return p.Command
}

// inCgroupOf lists the live processes in a cgroup named after container id: runc's, which
// a process of the container stays in when left outside it (its root, in its own mount
// namespace, reads as "/" from the host). Zombies, dead and waiting for this test (a
// subreaper) to reap them, are not listed.
func inCgroupOf(id string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, err := proctree.Read(pid); err != nil || p.Zombie {
			continue
		}
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasSuffix(line, "/"+id) {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// startGpucr starts gpucr with args, its stdout and stderr in out, and returns the channel
// its wait status comes on.
func startGpucr(t *testing.T, args ...string) (*exec.Cmd, *strings.Builder, <-chan error) {
	t.Helper()
	cmd := exec.Command(bin.gpucr, args...)
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	return cmd, out, done
}
