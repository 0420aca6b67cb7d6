package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/internal/engine"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/testutil"
)

func TestCheckpointRestoreKeepsMemoryAndCountsOn(t *testing.T) {
	needCRIU(t)
	w := startCounter(t, "-mib", "64")
	before := w.waitCount(t, 5)
	dir := filepath.Join(t.TempDir(), "img")
	out := mustGpucr(t, "checkpoint", strconv.Itoa(w.pid), "-D", dir)
	if !strings.Contains(out, "checkpointed PID "+strconv.Itoa(w.pid)) {
		t.Errorf("summary: %s", out)
	}
	testutil.WaitGone(t, w.pid)
	frozen := w.read(t, "count")
	if frozen < before {
		t.Fatalf("count went back: %d < %d", frozen, before)
	}
	mustGpucr(t, "verify", dir)
	ownerOnly(t, dir)
	// The counter's 64 MiB are one run that gpucr saved itself, while CRIU left it out of
	// its page files, and that gpucr writes back into the restored process.
	saved, _ := filepath.Glob(filepath.Join(dir, "mem", "*.img"))
	if pages := dirSize(t, filepath.Join(dir, "criu"), "pages-"); len(saved) == 0 || pages > 32<<20 {
		t.Errorf("gpucr saved %d ranges; CRIU's page files hold %d bytes", len(saved), pages)
	}
	var ins inspectDoc
	if err := json.Unmarshal([]byte(mustGpucr(t, "inspect", "--json", dir)), &ins); err != nil {
		t.Fatal(err)
	}
	if ps := ins.CRIU.Processes; len(ps) != 1 || ps[0].MemoryBytes < 64<<20 {
		t.Errorf("inspect counts %+v of the counter's memory, want its 64 MiB too", ps)
	}
	if filled := restoreCounts(t, w, dir, frozen); !filled {
		t.Error("no memory-fill phase")
	}
}

// ownerOnly fails t if a file of the image at dir can be read by others than its owner:
// it holds the process's memory. (CRIU's statistics, written after the commit, were 0644.)
func ownerOnly(t *testing.T, dir string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s: mode %v, want no access for group and others", p, fi.Mode().Perm())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// restoreCounts restores the counter w from dir with flags added, checks that it counts on
// from frozen with its memory intact, and says whether gpucr filled its memory itself.
func restoreCounts(t *testing.T, w *workload, dir string, frozen int, flags ...string) (filled bool) {
	t.Helper()
	rs := restoreJSON(t, nil, append([]string{"-D", dir}, flags...)...)
	if rs.RootPID != w.pid {
		t.Errorf("restored PID %d, want the original %d", rs.RootPID, w.pid)
	}
	w.waitCount(t, frozen+5)
	if v := w.verify(t, rs.RootPID); v != "ok" {
		t.Fatalf("memory pattern after restore: %s", v)
	}
	return hasPhase(rs.Phases, "memory-fill")
}

// With checkpoint --criu-writes-pages and restore --criu-restores-pages CRIU moves all
// memory itself, and the result is the same.
func TestCRIUMovesAllPagesWhenAsked(t *testing.T) {
	needCRIU(t)
	w := startCounter(t, "-mib", "64")
	w.waitCount(t, 5)
	dir := filepath.Join(t.TempDir(), "img")
	mustGpucr(t, "checkpoint", strconv.Itoa(w.pid), "-D", dir, "--criu-writes-pages")
	if saved, _ := filepath.Glob(filepath.Join(dir, "mem", "*")); len(saved) > 0 {
		t.Errorf("gpucr saved memory itself with --criu-writes-pages: %v", saved)
	}
	testutil.WaitGone(t, w.pid)
	if restoreCounts(t, w, dir, w.read(t, "count"), "--criu-restores-pages") {
		t.Error("memory-fill with --criu-restores-pages")
	}
}

// Shared anonymous memory and a memfd mapping go through gpucr's page server as CRIU's
// shared-memory pagemaps and come back intact, beside 32 MiB of private memory that gpucr
// fills itself.
func TestSharedMemoryRestores(t *testing.T) {
	needCRIU(t)
	w := startCounter(t, "-mib", "32", "-shm", "16")
	w.waitCount(t, 3)
	dir := checkpointGone(t, w)
	shmem, _ := filepath.Glob(filepath.Join(dir, "criu", "pagemap-shmem-*.img"))
	if len(shmem) == 0 {
		t.Fatal("no shared-memory pagemap in the image")
	}
	if !restoreCounts(t, w, dir, w.read(t, "count")) {
		t.Error("no memory-fill phase")
	}
}

// A parent holding 64 MiB with a child it feeds through a pipe: gpucr saves the parent's
// memory too (the child, started by exec, maps none of it), and both come back.
func TestTreeWithPipeRestores(t *testing.T) {
	needCRIU(t)
	w := startCounter(t, "-child", "-mib", "64")
	w.waitFile(t, "child", 3)
	dir := checkpointGone(t, w)
	if saved, _ := filepath.Glob(filepath.Join(dir, "mem", fmt.Sprintf("%d-*.img", w.pid))); len(saved) == 0 {
		t.Error("gpucr did not save the parent's 64 MiB itself")
	}

	var ins inspectDoc
	if err := json.Unmarshal([]byte(mustGpucr(t, "inspect", "--json", dir)), &ins); err != nil {
		t.Fatal(err)
	}
	ps := ins.CRIU.Processes
	if len(ps) != 2 || ps[0].PID != w.pid || ps[1].PPID != w.pid {
		t.Fatalf("inspect tree = %+v, want the counter and its child", ps)
	}
	if len(ins.Manifest.Processes) != 2 || ins.Manifest.CRIUVersion == "" || ins.Manifest.Host.Hostname == "" ||
		ins.Manifest.GpucrVersion != testVersion {
		t.Errorf("manifest = %+v", ins.Manifest)
	}

	child := w.read(t, "child")
	pid := restore(t, dir)
	// The child only counts what the parent sends through the pipe: both must be back.
	w.waitFile(t, "child", child+5)
	if v := w.verify(t, pid); v != "ok" {
		t.Fatalf("the parent's memory after restore: %s", v)
	}
}

func TestLeaveRunningThenRestoreAfterKill(t *testing.T) {
	needCRIU(t)
	w := startCounter(t, "-mib", "8")
	w.waitCount(t, 3)
	dir := filepath.Join(t.TempDir(), "img")
	out := mustGpucr(t, "checkpoint", "--leave-running", strconv.Itoa(w.pid), "-D", dir)
	at := w.read(t, "count")
	if !strings.Contains(out, "left running") {
		t.Errorf("summary does not say the tree was left running: %s", out)
	}
	w.waitCount(t, at+100) // still counting, well past the checkpoint
	if v := w.verify(t, w.pid); v != "ok" {
		t.Fatalf("memory after leave-running: %s", v)
	}

	// The original holds the PIDs: restore must refuse up front, then work once it is gone.
	if out, code := gpucr(t, "restore", "-D", dir); code == 0 || !strings.Contains(out, "in use") {
		t.Fatalf("restore while the original runs: exit %d: %s", code, out)
	}
	testutil.KillAndReap(w.pid)
	testutil.WaitGone(t, w.pid)
	os.Remove(filepath.Join(w.dir, "count"))
	pid := restore(t, dir)
	// The restored counter goes on from the checkpoint, not from where the original died.
	first := w.waitCount(t, 1)
	if first > at+50 {
		t.Errorf("restored counter started at %d, checkpoint was at about %d", first, at)
	}
	if v := w.verify(t, pid); v != "ok" {
		t.Fatalf("memory after restore: %s", v)
	}
}

func TestRunLaunchesACheckpointableJob(t *testing.T) {
	needCRIU(t)
	w := &workload{dir: t.TempDir()}
	w.cmd = exec.Command(bin.gpucr, "run", "--nproc-per-node", "2", "--", bin.counter, "-dir", w.dir, "-tick", "20ms")
	w.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.pid = w.cmd.Process.Pid
	go w.cmd.Wait() //nolint:errcheck // reaps the launcher when CRIU kills it
	t.Cleanup(func() { testutil.KillAndReap(w.pid) })
	w.waitFile(t, "count.0", 3)
	w.waitFile(t, "count.1", 3)

	var tree inspectDoc
	dir := checkpointGone(t, w)
	if err := json.Unmarshal([]byte(mustGpucr(t, "inspect", "--json", dir)), &tree); err != nil {
		t.Fatal(err)
	}
	if len(tree.CRIU.Processes) != 3 {
		t.Fatalf("image holds %d processes, want the launcher and 2 ranks", len(tree.CRIU.Processes))
	}
	for _, p := range tree.CRIU.Processes[1:] {
		env, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p.PID), "environ"))
		if len(env) != 0 {
			t.Errorf("rank %d still runs after the checkpoint", p.PID)
		}
	}
	c0, c1 := w.read(t, "count.0"), w.read(t, "count.1")
	restore(t, dir)
	w.waitFile(t, "count.0", c0+5)
	w.waitFile(t, "count.1", c1+5)
	for _, p := range tree.CRIU.Processes[1:] {
		env, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p.PID), "environ"))
		if err != nil || !strings.Contains(string(env), "NCCL_P2P_DISABLE=1\x00") || !strings.Contains(string(env), "RANK=") {
			t.Errorf("restored rank %d environment lacks the launcher's settings: %v", p.PID, err)
		}
	}
}

// No rank outlives gpucr run: a signal that would end the launcher reaches the ranks, and
// a launcher killed outright takes them with it. A review's SIGHUP killed the launcher and
// left both ranks running on their GPUs, outside any later checkpoint of its PID.
func TestRunLeavesNoRankBehind(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGKILL} {
		t.Run(unix.SignalName(sig), func(t *testing.T) {
			cmd, _ := startRunJob(t, bin.gpucr)
			tree, err := proctree.Tree(cmd.Process.Pid)
			if err != nil || len(tree) != 3 {
				t.Fatalf("gpucr run's tree: %v, %v; want the launcher and 2 ranks", tree, err)
			}
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()
			for _, r := range tree[1:] {
				if !testutil.ExitedWithin(r.PID, 5*time.Second) {
					_ = syscall.Kill(r.PID, syscall.SIGKILL)
					t.Errorf("rank %d runs on after gpucr run got %s", r.PID, unix.SignalName(sig))
				}
			}
		})
	}
}

// startRunJob starts `gpucr run` of two counting ranks through prefix (gpucr itself, or a
// command that ends by running gpucr with the arguments that follow), in a session of its
// own, and returns once both ranks count.
func startRunJob(t *testing.T, prefix ...string) (*exec.Cmd, *workload) {
	t.Helper()
	w := &workload{dir: t.TempDir()}
	args := slices.Concat(prefix[1:], []string{"run", "--nproc-per-node", "2", "--", bin.counter, "-dir", w.dir, "-tick", "20ms"})
	cmd := exec.Command(prefix[0], args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testutil.KillAndReap(cmd.Process.Pid) })
	w.waitFile(t, "count.0", 3)
	w.waitFile(t, "count.1", 3)
	return cmd, w
}

// Under nohup (SIGHUP ignored) the job survives a hang-up, launcher and ranks: caught and
// forwarded, SIGHUP was reset to its default in every rank, and a logout ended the job.
func TestRunUnderNohupSurvivesAHangUp(t *testing.T) {
	cmd, w := startRunJob(t, "sh", "-c", `trap '' HUP; exec "$0" "$@"`, bin.gpucr)
	// The whole session hangs up, as at a logout.
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	c0, c1 := w.read(t, "count.0"), w.read(t, "count.1")
	w.waitFile(t, "count.0", c0+5)
	w.waitFile(t, "count.1", c1+5)
	if !testutil.Alive(cmd.Process.Pid) {
		t.Fatal("gpucr run died of a hang-up it was started to ignore")
	}
}

// A job holding an established TCP connection is refused without --tcp-established before
// anything is locked, and --dry-run says so (it found nothing, and the checkpoint failed
// in CRIU, a GPU job's device state locked and checkpointed first: hostile test); with it,
// the connection comes back with the job.
func TestEstablishedTCPConnectionSurvives(t *testing.T) {
	needCRIU(t)
	w := startCounter(t, "-tcp")
	w.waitCount(t, 3)
	dir := filepath.Join(t.TempDir(), "img")
	if out, code := gpucr(t, "checkpoint", strconv.Itoa(w.pid), "--dry-run"); code != exitFailed || !strings.Contains(out, "tcp-established: process") {
		t.Errorf("dry run of a job with a TCP connection: exit %d: %s", code, out)
	}
	if out, code := gpucr(t, "checkpoint", strconv.Itoa(w.pid), "--dry-run", "--tcp-established"); code != 0 {
		t.Errorf("dry run with --tcp-established: exit %d: %s", code, out)
	}
	if out, code := gpucr(t, "checkpoint", strconv.Itoa(w.pid), "-D", filepath.Join(t.TempDir(), "refused")); code == 0 || !oneLineWith(out, "(check tcp-established)") {
		t.Fatalf("checkpoint of a TCP connection without --tcp-established: exit %d: %s", code, out)
	}
	if !testutil.Alive(w.pid) {
		t.Fatal("the refused checkpoint killed the workload")
	}
	mustGpucr(t, "checkpoint", "--tcp-established", strconv.Itoa(w.pid), "-D", dir)
	testutil.WaitGone(t, w.pid)
	at := w.read(t, "count")
	restore(t, dir)       // the restore repeats --tcp-established from the image
	w.waitCount(t, at+10) // each count went through the restored connection
}

// A listener with a connection the kernel has completed and the job has not accepted
// passed --dry-run, and CRIU's dump then failed "In-flight connection (l)", with
// --tcp-established or without, for a GPU job after its device state was locked and
// checkpointed (review). It is refused up front now, and once the job has accepted, the
// same listener is checkpointed and restored, and listens again.
func TestListenerWithAConnectionNotAcceptedIsRefused(t *testing.T) {
	needCRIU(t)
	w := startPython(t, `import os, socket, sys, time
d = sys.argv[1]
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.bind(("127.0.0.1", 0)); s.listen(8); s.setblocking(False)
with open(os.path.join(d, "port.tmp"), "w") as f:
    f.write("%d\n" % s.getsockname()[1])
os.rename(os.path.join(d, "port.tmp"), os.path.join(d, "port"))
`+countLoop+`
def accept(i):
    if os.path.exists(os.path.join(d, "accept")):
        try:
            s.accept()[0].close()
        except BlockingIOError:
            pass
count(lambda i: True, accept)
`)
	addr := "127.0.0.1:" + strconv.Itoa(w.read(t, "port"))
	pid := strconv.Itoa(w.pid)
	if out, code := gpucr(t, "checkpoint", pid, "--dry-run"); code != 0 {
		t.Fatalf("dry run of a listener with nothing to accept: exit %d: %s", code, out)
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, flags := range [][]string{nil, {"--tcp-established"}} {
		if out, code := gpucr(t, append([]string{"checkpoint", pid, "--dry-run"}, flags...)...); code != exitFailed ||
			!strings.Contains(out, "tcp-pending: process") || !strings.Contains(out, "listens on "+addr+" with 1 connection(s)") {
			t.Errorf("dry run %v of a listener with a connection not accepted: exit %d: %s", flags, code, out)
		}
	}
	if out, code := gpucr(t, "checkpoint", pid, "--tcp-established", "-D", filepath.Join(t.TempDir(), "refused")); code != exitFailed || !oneLineWith(out, "(check tcp-pending)") {
		t.Fatalf("checkpoint of a listener with a connection not accepted: exit %d, want %d and one line: %s", code, exitFailed, out)
	}
	w.checkCountsOn(t, "the refusal")
	// The client closes first, then the job accepts and closes: the connection's TIME_WAIT is
	// the client's, on its own port, not on the one the restored listener binds again.
	c.Close()
	testutil.WriteFile(t, filepath.Join(w.dir, "accept"), nil)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		out, code := gpucr(t, "checkpoint", pid, "--dry-run")
		if code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job accepted, and a dry run still finds: %s", out)
		}
	}
	dir := checkpointGone(t, w)
	at := w.read(t, "count")
	restore(t, dir)
	w.waitCount(t, at+5)
	again, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("the restored job does not listen on %s: %v", addr, err)
	}
	again.Close()
}

// An image whose criu/ anyone may write in is restored from a private copy of CRIU's files
// (what CRIU reads is what was checked), with its memory intact, and the copy is gone after.
func TestRestoreOfAnImageOthersCouldChange(t *testing.T) {
	needCRIU(t)
	w := startCounter(t, "-mib", "16")
	w.waitCount(t, 3)
	dir := checkpointGone(t, w)
	frozen := w.read(t, "count")
	if err := os.Chmod(filepath.Join(dir, "criu"), 0o777); err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	_, errOut, code := gpucrEnv(t, []string{"TMPDIR=" + tmp}, "restore", "-v", "-D", dir)
	if code != 0 || !strings.Contains(errOut, "copied to a private directory") {
		t.Fatalf("restore: exit %d, want 0 from a private copy:\n%s", code, errOut)
	}
	t.Cleanup(func() { testutil.KillAndReap(w.pid) })
	w.waitCount(t, frozen+3)
	if v := w.verify(t, w.pid); v != "ok" {
		t.Fatalf("memory after the restore: %s", v)
	}
	if left, _ := filepath.Glob(filepath.Join(tmp, "gpucr-image-*")); len(left) > 0 {
		t.Errorf("the private copy is left: %v", left)
	}
}

// A relative -D named the file of ranges gpucr saves itself relative to CRIU's working
// directory, where it is not: CRIU dumped all that memory too, the image twice its size and
// the pause twice as long, and its log's first error hid any real one (hostile test).
func TestRelativeImageDirLeavesTheSavedMemoryToGpucr(t *testing.T) {
	needCRIU(t)
	w := startCounter(t, "-mib", "64")
	w.waitCount(t, 2)
	cwd := t.TempDir()
	cmd := exec.Command(bin.gpucr, "checkpoint", strconv.Itoa(w.pid), "-D", "img", "--leave-running")
	cmd.Dir = cwd
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("checkpoint -D img: %v\n%s", err, out)
	}
	var criuPages int64
	pages, _ := filepath.Glob(filepath.Join(cwd, "img", "criu", "pages-*.img"))
	for _, p := range pages {
		if fi, err := os.Stat(p); err == nil {
			criuPages += fi.Size()
		}
	}
	if saved, _ := filepath.Glob(filepath.Join(cwd, "img", "mem", "*.img")); len(saved) == 0 || criuPages > 32<<20 {
		t.Errorf("gpucr saved %d files itself, CRIU's pages hold %d bytes: the 64 MiB went to CRIU", len(saved), criuPages)
	}
}

// A shell job that had a terminal restores from a terminal, given it: CRIU finds the
// terminal on its stdin, which was /dev/null, and every restore of such a job failed after
// its checkpoint had ended it ("Don't have tty to inherit session from", hostile test).
func TestShellJobWithATerminalRestoresFromOne(t *testing.T) {
	needCRIU(t)
	script, err := exec.LookPath("script")
	if err != nil {
		t.Skip("no script(1) to give a terminal")
	}
	dir := t.TempDir()
	job := exec.Command("setsid", script, "-qfc", bin.counter+" -dir "+dir+" -tick 20ms", "/dev/null")
	if err := job.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = job.Process.Kill(); _ = job.Wait() })
	w := &workload{dir: dir, pid: waitDescendant(t, job.Process.Pid, "counter")}
	t.Cleanup(func() { testutil.KillAndReap(w.pid) })
	w.waitCount(t, 2)
	img := filepath.Join(t.TempDir(), "img")
	mustGpucr(t, "checkpoint", strconv.Itoa(w.pid), "-D", img, "--shell-job")
	frozen := w.read(t, "count")
	restore := exec.Command(script, "-qfc", bin.gpucr+" restore -D "+img+" && sleep 5", "/dev/null")
	out, err := restore.CombinedOutput()
	if err != nil || w.read(t, "count") < frozen+3 {
		t.Fatalf("restore from a terminal: %v, count %d after %d\n%s", err, w.read(t, "count"), frozen, out)
	}
}

// A job whose output is piped to a process outside its tree (`job | tee log`) checkpointed,
// restored with exit 0, and died at its next line of output, its pipe's reader gone
// (hostile test): it is refused before anything is frozen, the job runs on, and
// --skip-check outer-pipe lets a user who knows it never writes there again go ahead.
func TestTreeWithAPipeToTheOutsideIsRefused(t *testing.T) {
	needCRIU(t)
	dir := t.TempDir()
	job := exec.Command("setsid", "sh", "-c", bin.counter+" -dir "+dir+" -tick 20ms | cat >/dev/null")
	if err := job.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-job.Process.Pid, syscall.SIGKILL); _ = job.Wait() })
	w := &workload{dir: dir, pid: waitDescendant(t, job.Process.Pid, "counter")}
	w.waitCount(t, 2)
	img := filepath.Join(t.TempDir(), "img")
	out, code := gpucr(t, "checkpoint", strconv.Itoa(w.pid), "-D", img)
	if code == 0 || !oneLineWith(out, "shares a pipe") || !strings.Contains(out, "(cat), outside the tree") {
		t.Fatalf("checkpoint of a job piped to cat: exit %d\n%s", code, out)
	}
	// --dry-run --json prints its findings as the one document on stdout: it was followed by
	// a second, the error's, which a machine reading one document cannot parse (documentation
	// walk).
	stdout, _, code := gpucrEnv(t, nil, "checkpoint", strconv.Itoa(w.pid), "--dry-run", "--json")
	var a engine.Analysis
	dec := json.NewDecoder(strings.NewReader(stdout))
	if err := dec.Decode(&a); err != nil || code != exitFailed || len(a.Findings) != 1 || a.Findings[0].Check != "outer-pipe" || dec.More() {
		t.Errorf("dry run --json: exit %d, want %d and one document holding the finding (%v):\n%s", code, exitFailed, err, stdout)
	}
	w.waitCount(t, w.read(t, "count")+2)
	mustGpucr(t, "checkpoint", strconv.Itoa(w.pid), "-D", img, "--leave-running", "--shell-job", "--skip-check", "outer-pipe")
}

// A job that appends to its log (>>), checkpointed with --leave-running and then going on
// writing it, restores: CRIU records no size for a file opened write-only for appending,
// which loses nothing by growing, and the restore appends after what was written since.
// The error for a log opened with > says so (criu.Error's hint for "has bad size").
func TestAppendedLogGrownSinceTheCheckpointRestores(t *testing.T) {
	needCRIU(t)
	log := filepath.Join(t.TempDir(), "job.log")
	w := startCounter(t, "-tick", "20ms", "-log", log)
	w.waitCount(t, 3)
	dir := filepath.Join(t.TempDir(), "img")
	if out := mustGpucr(t, "checkpoint", "--leave-running", strconv.Itoa(w.pid), "-D", dir); strings.Contains(out, "output ") {
		t.Errorf("a log appended to is named as an output to truncate: %s", out)
	}
	at := w.goOnThenKill(t, 5)
	before, _ := os.ReadFile(log)
	// The killed counter left its count past at+3: only the restored one's may count.
	os.Remove(filepath.Join(w.dir, "count"))
	pid := restore(t, dir)
	t.Cleanup(func() { testutil.KillAndReap(pid) })
	w.waitCount(t, at+3)
	after, _ := os.ReadFile(log)
	if !bytes.HasPrefix(after, before) || len(after) <= len(before) {
		t.Fatalf("the log was not appended to after the restore: %d bytes before, %d after", len(before), len(after))
	}
}

// A job whose output goes to a file with >, checkpointed with --leave-running and going on
// writing it: CRIU refuses the restore ("has bad size"), and the error said nothing more
// (hostile test). It now says to truncate the file to its size at the checkpoint, with the
// command; done as said, the restore goes on from the checkpoint.
func TestOutputGrownSinceTheCheckpointSaysHowToRestore(t *testing.T) {
	needCRIU(t)
	out := filepath.Join(t.TempDir(), "job.out")
	w := startCounter(t, "-tick", "20ms", "-out", out)
	w.waitCount(t, 3)
	dir := filepath.Join(t.TempDir(), "img")
	var ck struct {
		Outputs []struct {
			Path string `json:"path"`
			Size int64  `json:"size"`
		} `json:"outputs"`
	}
	if err := json.Unmarshal([]byte(mustGpucr(t, "checkpoint", "--json", "--leave-running", strconv.Itoa(w.pid), "-D", dir)), &ck); err != nil {
		t.Fatal(err)
	}
	if len(ck.Outputs) != 1 || ck.Outputs[0].Path != out || ck.Outputs[0].Size <= 0 {
		t.Fatalf("the checkpoint's outputs %+v, want %s with its size", ck.Outputs, out)
	}
	at := w.goOnThenKill(t, 5)
	msg, code := gpucr(t, "restore", "-D", dir)
	m := regexp.MustCompile(`truncate -s (\d+) (\S+)\)`).FindStringSubmatch(msg)
	if code == 0 || !oneLineWith(msg, "has bad size") || m == nil || m[2] != out || m[1] != strconv.FormatInt(ck.Outputs[0].Size, 10) {
		t.Fatalf("restore after the output grew: exit %d, want one line saying to truncate %s:\n%s", code, out, msg)
	}
	if b, err := exec.Command("truncate", "-s", m[1], m[2]).CombinedOutput(); err != nil {
		t.Fatalf("truncate as told: %v: %s", err, b)
	}
	// The task CRIU forked at the image's PID and killed is left to this test, a subreaper,
	// and may die only after gpucr returns: reaped once at once, it held the PID for the
	// next restore (a hostile tester's run under load, 1 of 15).
	testutil.WaitReaped(t, w.pid)
	// The killed counter left its count past at+3: only the restored one's may count.
	os.Remove(filepath.Join(w.dir, "count"))
	pid := restore(t, dir)
	t.Cleanup(func() { testutil.KillAndReap(pid) })
	if first := w.waitCount(t, at+3); first > at+50 {
		t.Errorf("restored counter at %d, checkpoint at about %d", first, at)
	}
}

// networkLock is the nftables table CRIU's network lock makes for the dump of the image
// at dir, in gpucr's network namespace ("inet CRIU-" and the dump's run ID, cut as CRIU
// cuts it), and whether nft lists it. The run ID is the one UUID in CRIU's inventory (a
// field go-criu's copy of the format predates). One table is asked for, by name: nft lists
// them all only after reading every one, minutes on a host that kept thousands.
func networkLock(t *testing.T, dir string) (string, bool) {
	t.Helper()
	nft, err := exec.LookPath("nft")
	if err != nil {
		testutil.SkipOrFail(t, "nft not found (make deps installs nftables)")
	}
	b, err := os.ReadFile(filepath.Join(dir, "criu", "inventory.img"))
	if err != nil {
		t.Fatal(err)
	}
	id := regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`).Find(b)
	if id == nil {
		t.Fatalf("no run ID in %s", dir)
	}
	table := ("inet CRIU-" + string(id))[:31]
	out, err := exec.Command(nft, "list", "table", table).CombinedOutput()
	if err != nil && !strings.Contains(string(out), "No such file or directory") {
		t.Fatalf("nft list table %s: %v: %s", table, err, out)
	}
	return table, err == nil
}

// A checkpoint of a tree without TCP connections to lock left CRIU's nftables table in the
// host's network namespace, hooked into every packet's way in and out, until a restore of
// that very image on this host: each image moved to another host, or never restored, left
// one for good (hostile test: 953 on the test host, and 1000 of them took a loopback
// packet's round trip from 6 to 170 us). It leaves none, and its image still restores.
func TestCheckpointLeavesNoNetworkLock(t *testing.T) {
	needCRIU(t)
	w := startCounter(t)
	w.waitCount(t, 3)
	dir := checkpointGone(t, w)
	if table, ok := networkLock(t, dir); ok {
		t.Errorf("the checkpoint left CRIU's network lock: %s", table)
	}
	at := w.read(t, "count")
	restore(t, dir)
	t.Cleanup(func() { testutil.KillAndReap(w.pid) })
	w.waitCount(t, at+3)
}
