package container

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/engine"
	"github.com/gpucr/gpucr/internal/freezer"
	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/gpu/gputest"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/testutil"
	"github.com/gpucr/gpucr/internal/txn"
)

// fakeGPU stands in for the GPU driver, the one hardware edge these tests cannot reach: it
// claims one PID as a GPU process and follows the driver's state machine.
type fakeGPU struct {
	mu       sync.Mutex
	pid      int
	state    gpu.State
	calls    []string
	failStep string   // a step that fails
	roots    []string // the restored processes' roots the restores were planned for
}

func (f *fakeGPU) Name() string { return "fake" }
func (f *fakeGPU) Host(context.Context) (gpu.Host, error) {
	return gpu.Host{DriverVersion: "1.0", Devices: []gpu.Device{{UUID: "GPU-a", Name: "fake", MemoryTotal: 1 << 30}}}, nil
}

// PlanRestore takes an image whose processes used only the fake's one device.
func (f *fakeGPU) PlanRestore(_ context.Context, in gpu.RestoreInput) (*gpu.Plan, error) {
	f.mu.Lock()
	f.roots = append(f.roots, in.Root)
	f.mu.Unlock()
	return gputest.PlanOnto(in, "GPU-a")
}
func (f *fakeGPU) Processes(_ context.Context, tree *proctree.Snapshot) ([]gpu.Process, error) {
	if slices.Contains(tree.PIDs(), f.pid) {
		return []gpu.Process{{PID: f.pid, Devices: []string{"GPU-a"}, MemoryBytes: 1 << 20}}, nil
	}
	return nil, nil
}
func (f *fakeGPU) step(name string, pid int, from, to gpu.State) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, name)
	switch {
	case pid != f.pid:
		return errors.New(name + ": not a GPU process: " + strconv.Itoa(pid))
	case !runs(pid):
		return errors.New(name + ": the process does not run: the driver would wait for it as long as it stays so")
	case name == f.failStep:
		return errors.New(name + " failed")
	case f.state != from:
		return errors.New(name + " from state " + f.state.String())
	}
	f.state = to
	return nil
}

// runs is what the driver needs of a process to lock, checkpoint or resume it.
func runs(pid int) bool {
	p, err := proctree.Read(pid)
	if err != nil || p.State == 'T' || p.State == 't' {
		return false
	}
	c, err := freezer.Holding(pid)
	return err == nil && c == nil
}

func (f *fakeGPU) Lock(_ context.Context, pid int, _ time.Duration) error {
	return f.step("lock", pid, gpu.StateRunning, gpu.StateLocked)
}
func (f *fakeGPU) Checkpoint(_ context.Context, pid int) error {
	return f.step("checkpoint", pid, gpu.StateLocked, gpu.StateCheckpointed)
}
func (f *fakeGPU) Restore(_ context.Context, pid int, _ map[string]string) error {
	return f.step("restore", pid, gpu.StateCheckpointed, gpu.StateLocked)
}
func (f *fakeGPU) Unlock(_ context.Context, pid int) error {
	return f.step("unlock", pid, gpu.StateLocked, gpu.StateRunning)
}
func (f *fakeGPU) State(context.Context, int) (gpu.State, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state, nil
}
func (f *fakeGPU) log() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

type actionEnv struct {
	act     *Action
	env     map[string]string
	watched []string
}

func newAction(t *testing.T, f *fakeGPU, step string, root int) *actionEnv {
	a := &actionEnv{env: map[string]string{
		envAction: step, envInitPID: strconv.Itoa(root), envImageDir: t.TempDir(),
	}}
	a.act = &Action{
		Backends: []gpu.Backend{f}, Getenv: func(k string) string { return a.env[k] }, CRIUPID: os.Getpid(), // the test stands for CRIU
		StateDir: t.TempDir(), Version: "test", Log: slog.New(slog.DiscardHandler),
		Watch: func(criuPID int, held string, locks []*os.File) error {
			a.watched = append(a.watched, held)
			return nil
		},
	}
	return a
}

// Pre-dump locks and checkpoints the GPUs, records them in the image, and starts the
// watcher. An earlier dump's record in a reused image directory (runc's ./checkpoint) is
// replaced: a hostile test's second dump took the first's for its own and skipped the GPUs.
// (CRIU runs the script twice a step; the script, not gpucr, stops the second run.)
func TestPreDumpLocksRecordsAndStartsWatcher(t *testing.T) {
	p := testutil.StartSleeper(t)
	f := &fakeGPU{pid: p.Process.Pid}
	a := newAction(t, f, "pre-dump", p.Process.Pid)
	testutil.WriteFile(t, filepath.Join(a.env[envImageDir], RecordName), []byte(`{"gpucrVersion":"earlier","gpus":[]}`))
	if err := a.act.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := f.log(); !slices.Equal(got, []string{"lock", "checkpoint"}) {
		t.Fatalf("GPU calls %v, want one lock and one checkpoint", got)
	}
	if len(a.watched) != 1 {
		t.Fatalf("watcher started %d times, want once", len(a.watched))
	}
	rec, err := ReadRecord(a.env[envImageDir])
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.GPUs) != 1 || rec.GPUs[0].Backend != "fake" || rec.GPUs[0].Processes[0].PID != p.Process.Pid {
		t.Fatalf("record %+v", rec)
	}

	// CRIU exits with the tree alive (the dump failed, or --leave-running): roll back.
	if err := RollBack(context.Background(), []gpu.Backend{f}, a.watched[0], slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if got := f.log(); !slices.Equal(got, []string{"lock", "checkpoint", "restore", "unlock"}) {
		t.Fatalf("GPU calls %v after rollback", got)
	}
	if _, err := os.Stat(a.watched[0]); !os.IsNotExist(err) {
		t.Errorf("rollback state left behind: %v", err)
	}
}

func TestPreDumpFailureRollsBackAndAbortsTheDump(t *testing.T) {
	p := testutil.StartSleeper(t)
	f := &fakeGPU{pid: p.Process.Pid, failStep: "checkpoint"}
	a := newAction(t, f, "pre-dump", p.Process.Pid)
	if err := a.act.Run(context.Background()); err == nil {
		t.Fatal("pre-dump succeeded with a failing GPU checkpoint: CRIU would dump a tree whose GPU state is not in memory")
	}
	if f.state != gpu.StateRunning {
		t.Fatalf("GPU left %s, want running", f.state)
	}
	if _, err := ReadRecord(a.env[envImageDir]); !os.IsNotExist(err) {
		t.Errorf("record written for a failed pre-dump: %v", err)
	}
	// The watcher, started before the lock, finds nothing left to do.
	if err := RollBack(context.Background(), []gpu.Backend{f}, a.watched[0], slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if got := f.log(); !slices.Equal(got, []string{"lock", "checkpoint", "unlock"}) {
		t.Fatalf("GPU calls %v", got)
	}
}

func TestRollBackLeavesKilledTreeAlone(t *testing.T) {
	p := testutil.StartSleeper(t)
	f := &fakeGPU{pid: p.Process.Pid, state: gpu.StateCheckpointed}
	held := filepath.Join(t.TempDir(), "held.json")
	proc, err := txn.ProcOf(p.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal([]txn.GPUProc{{Backend: "fake", Proc: proc}})
	if err := os.WriteFile(held, b, 0o600); err != nil {
		t.Fatal(err)
	}
	// The dump succeeded and CRIU killed the tree: the exit status says nothing.
	if err := p.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = p.Wait()
	if err := RollBack(context.Background(), []gpu.Backend{f}, held, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if got := f.log(); len(got) != 0 {
		t.Fatalf("GPU calls %v for a process that is gone", got)
	}
}

// dumpedForRestore runs pre-dump of the tree at root with f's GPU, and returns the
// pre-restore step of a restore of that image (no process restored yet).
func dumpedForRestore(t *testing.T, f *fakeGPU, root int) *actionEnv {
	t.Helper()
	dump := newAction(t, f, "pre-dump", root)
	if err := dump.act.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	a := newAction(t, f, "pre-restore", 0)
	a.env[envImageDir], a.env[envInitPID] = dump.env[envImageDir], ""
	return a
}

func TestRestoreStepsBringGPUStateBack(t *testing.T) {
	p := testutil.StartSleeper(t)
	f := &fakeGPU{pid: p.Process.Pid}
	a := dumpedForRestore(t, f, p.Process.Pid)
	// What CRIUs that are gone left (a failed restore's record, the script's marks) goes at
	// pre-restore; what a CRIU that runs left, and other files, stay.
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	self, err := proctree.Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	left := []string{fmt.Sprintf("restore-%d.7.json", gone.Process.Pid), fmt.Sprintf("%d.7.pre-restore", gone.Process.Pid)}
	kept := []string{fmt.Sprintf("%d.%d.pre-restore", self.PID, self.Start), "dump-1.json"}
	for _, name := range append(slices.Clone(left), kept...) {
		testutil.WriteFile(t, filepath.Join(a.act.StateDir, name), []byte("{}"))
	}
	for range 2 {
		if err := a.act.Run(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	a.env[envAction], a.env[envInitPID] = "post-resume", strconv.Itoa(p.Process.Pid)
	for range 2 {
		if err := a.act.Run(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.log(); !slices.Equal(got, []string{"lock", "checkpoint", "restore", "unlock"}) {
		t.Fatalf("GPU calls %v", got)
	}
	for _, name := range left {
		if _, err := os.Stat(filepath.Join(a.act.StateDir, name)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s, left by a CRIU that is gone, stays: %v", name, err)
		}
	}
	for _, name := range kept {
		if _, err := os.Stat(filepath.Join(a.act.StateDir, name)); err != nil {
			t.Errorf("%s was removed: %v", name, err)
		}
	}
	// pre-restore checks the whole host (no process yet); post-resume places the state on
	// the GPUs the restored container's own /dev holds.
	own := fmt.Sprintf("/proc/%d/root", p.Process.Pid)
	if !slices.Equal(f.roots, []string{"", "", own}) {
		t.Fatalf("restores planned for roots %q, want pre-restore's twice on the host and post-resume's in %s", f.roots, own)
	}
}

func TestPreRestoreRefusesWithoutTheBackend(t *testing.T) {
	p := testutil.StartSleeper(t)
	f := &fakeGPU{pid: p.Process.Pid}
	a := dumpedForRestore(t, f, p.Process.Pid)
	a.act.Backends = nil // a host without the GPU backend
	if err := a.act.Run(context.Background()); err == nil {
		t.Fatal("pre-restore accepted GPU state this host cannot take: CRIU would restore a process without it")
	}
}

func TestActionSkipEnvLeavesGPUsAlone(t *testing.T) {
	p := testutil.StartSleeper(t)
	f := &fakeGPU{pid: p.Process.Pid}
	a := newAction(t, f, "pre-dump", p.Process.Pid)
	a.env[ActionSkipEnv] = "skip"
	if err := a.act.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := f.log(); len(got) != 0 {
		t.Fatalf("GPU calls %v under %s=skip", got, ActionSkipEnv)
	}
}

// TestMain doubles as the watcher process for TestWatcherWaitsForCRIU.
func TestMain(m *testing.M) {
	if out := os.Getenv("GPUCR_TEST_WATCHER_OUT"); out != "" {
		err := WaitCRIU()
		msg := "exited"
		if err != nil {
			msg = err.Error()
		}
		_ = os.WriteFile(out, []byte(msg), 0o600)
		os.Exit(0)
	}
	if os.Getenv("GPUCR_TEST_LEAVE_CGROUPS") != "" {
		// A watcher's first step, once its parent has put it in a cgroup and says so.
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		fmt.Println(len(LeaveCallersCgroups()))
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestWatcherWaitsForCRIU(t *testing.T) {
	criu := exec.Command("sleep", "0.5") // stands for the CRIU that runs the script
	if err := criu.Start(); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "watcher")
	t.Setenv("GPUCR_TEST_WATCHER_OUT", out)
	if err := StartWatcher(os.Args[0], []string{"-test.run=^$"}, criu.Process.Pid, nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if _, err := os.Stat(out); err == nil {
		t.Fatal("the watcher did not wait for CRIU to exit")
	}
	if err := criu.Wait(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(out)
		if err == nil && len(b) > 0 {
			if string(b) != "exited" {
				t.Fatalf("watcher: %s", b)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the watcher did not notice CRIU's exit")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestInstallKeepsOtherLinesAndRemoves(t *testing.T) {
	dir := t.TempDir()
	in := Integration{Config: filepath.Join(dir, "criu", "runc.conf"), Script: filepath.Join(dir, "bin", "criu-action"),
		Log: filepath.Join(dir, "action.log"), Gpucr: fakeGpucr(t, filepath.Join(dir, "ran"))}
	if err := os.MkdirAll(filepath.Dir(in.Config), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(in.Config, []byte("tcp-established\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for range 2 { // installing again replaces, never duplicates
		if err := in.Install(); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := os.ReadFile(in.Config)
	if want := "tcp-established\naction-script " + in.Script + "\n"; string(b) != want {
		t.Fatalf("config:\n%s\nwant:\n%s", b, want)
	}
	if fi, err := os.Stat(in.Script); err != nil || fi.Mode()&0o111 == 0 {
		t.Fatalf("script not executable: %v", err)
	}
	if _, err := os.Stat(in.Binary()); err != nil {
		t.Fatalf("no copy of gpucr beside the script: %v", err)
	}
	if _, err := in.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(in.Binary()); !os.IsNotExist(err) {
		t.Fatalf("gpucr's copy left: %v", err)
	}
	b, _ = os.ReadFile(in.Config)
	if string(b) != "tcp-established\n" {
		t.Fatalf("config after remove: %q", b)
	}
	if _, err := os.Stat(in.Script); !os.IsNotExist(err) {
		t.Fatalf("script left: %v", err)
	}
}

// Remove deletes only what no other install uses: a script another configuration file an
// install recorded still names, and gpucr's copy another script beside it still runs, are
// kept and said to be. A tester's remove of one script deleted the copy another ran, and a
// remove through one configuration file the script another still named.
func TestRemoveKeepsWhatAnotherInstallUses(t *testing.T) {
	dir := t.TempDir()
	gpucr := fakeGpucr(t, filepath.Join(dir, "ran"))
	a := Integration{Config: filepath.Join(dir, "a.conf"), Script: filepath.Join(dir, "bin", "criu-action"),
		Log: filepath.Join(dir, "action.log"), Gpucr: gpucr}
	b, c := a, a
	b.Config = filepath.Join(dir, "b.conf")
	c.Config, c.Script = filepath.Join(dir, "c.conf"), filepath.Join(dir, "bin", "criu-action2")
	for _, in := range []Integration{a, b, c} {
		if err := in.Install(); err != nil {
			t.Fatal(err)
		}
	}
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }

	r, err := c.Remove()
	if err != nil {
		t.Fatal(err)
	}
	if exists(c.Script) || !exists(c.Binary()) || len(r.Kept) != 1 || !strings.Contains(r.Kept[0], "still run by "+a.Script) {
		t.Errorf("remove of the second script: %+v; gpucr's copy there: %v", r, exists(c.Binary()))
	}
	r, err = b.Remove()
	if err != nil {
		t.Fatal(err)
	}
	if !exists(a.Script) || !exists(a.Binary()) || !slices.Equal(r.Removed, []string{b.Config}) || len(r.Kept) != 1 || !strings.Contains(r.Kept[0], "still named by "+a.Config) {
		t.Errorf("remove through the second configuration file: %+v; the script there: %v", r, exists(a.Script))
	}
	if conf, _ := os.ReadFile(b.Config); strings.Contains(string(conf), a.Script) {
		t.Errorf("the configuration file removed from still names the script:\n%s", conf)
	}
	r, err = a.Remove()
	if err != nil {
		t.Fatal(err)
	}
	if exists(a.Script) || exists(a.Binary()) || len(r.Kept) != 0 || !slices.Equal(r.Removed, []string{a.Config, a.Script, a.Binary()}) {
		t.Errorf("the last remove: %+v", r)
	}
	if left, _ := os.ReadDir(filepath.Dir(a.Script)); len(left) != 0 {
		t.Errorf("left beside the script: %v", left)
	}
}

// crun reads its own file only where it exists, runc's otherwise: the script goes into
// crun's where it exists and comes out again, and none is created.
func TestInstallAddsToCrunsFileOnlyWhereItExists(t *testing.T) {
	dir := t.TempDir()
	in := Integration{Config: filepath.Join(dir, "runc.conf"), CrunConfig: filepath.Join(dir, "crun.conf"),
		Script: filepath.Join(dir, "bin", "criu-action"), Log: filepath.Join(dir, "action.log"), Gpucr: fakeGpucr(t, filepath.Join(dir, "ran"))}
	if err := in.Install(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(in.CrunConfig); !os.IsNotExist(err) || !in.CrunReadsRunc() {
		t.Fatalf("crun's file created (%v): crun would stop reading runc's", err)
	}
	if _, err := in.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(in.Config); !os.IsNotExist(err) {
		t.Fatalf("runc's file, created by install, left by remove: %v", err)
	}

	for _, conf := range []string{in.Config, in.CrunConfig} {
		if err := os.WriteFile(conf, []byte("tcp-established\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := in.Install(); err != nil {
		t.Fatal(err)
	}
	for _, conf := range []string{in.Config, in.CrunConfig} {
		if b, _ := os.ReadFile(conf); string(b) != "tcp-established\naction-script "+in.Script+"\n" {
			t.Errorf("%s after install: %q", conf, b)
		}
	}
	if _, err := in.Remove(); err != nil {
		t.Fatal(err)
	}
	for _, conf := range []string{in.Config, in.CrunConfig} {
		if b, _ := os.ReadFile(conf); string(b) != "tcp-established\n" {
			t.Errorf("%s after remove: %q", conf, b)
		}
	}
}

// fakeGpucr is a stand-in for the gpucr binary that records in ran that it ran.
func fakeGpucr(t *testing.T, ran string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "gpucr")
	if err := os.WriteFile(p, []byte("#!/bin/sh\necho \"$@\" > "+ran+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// The action script runs as root on every CRIU run of runc: it runs gpucr's own copy, in a
// directory only root can change, and refuses to run it once someone else could have
// replaced it. Installing into such a directory is refused.
func TestIntegrationRunsOnlyARootOwnedCopy(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the copy must be root's")
	}
	dir := t.TempDir()
	ran := filepath.Join(dir, "ran")
	in := Integration{Config: filepath.Join(dir, "runc.conf"), Script: filepath.Join(dir, "lib", "criu-action"),
		Log: filepath.Join(dir, "action.log"), StateDir: filepath.Join(dir, "state"), Gpucr: fakeGpucr(t, ran)}
	if err := in.Install(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(in.Gpucr); err != nil { // the installed binary moves away: no matter
		t.Fatal(err)
	}
	// A restore of an image with GPU state: a step the script starts gpucr for.
	img := t.TempDir()
	if err := os.WriteFile(filepath.Join(img, RecordName), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	script := func() *exec.Cmd {
		os.RemoveAll(in.StateDir) // its record of the steps it ran
		cmd := exec.Command(in.Script)
		cmd.Env = append(os.Environ(), "CRTOOLS_SCRIPT_ACTION=pre-restore", "CRTOOLS_IMAGE_DIR="+img)
		return cmd
	}
	if out, err := script().CombinedOutput(); err != nil {
		t.Fatalf("action script: %v: %s", err, out)
	}
	if b, err := os.ReadFile(ran); err != nil || !strings.HasPrefix(string(b), "criu-action") {
		t.Fatalf("the copy did not run: %q %v", b, err)
	}
	os.Remove(ran)
	if err := os.Chmod(filepath.Dir(in.Script), 0o777); err != nil {
		t.Fatal(err)
	}
	out, err := script().CombinedOutput()
	if err == nil || !strings.Contains(string(out), "refusing to run") {
		t.Fatalf("script under a world-writable directory: %v: %s", err, out)
	}
	if _, err := os.Stat(ran); !os.IsNotExist(err) {
		t.Fatal("the binary ran from a directory others can write")
	}
	in.Gpucr = fakeGpucr(t, ran)
	if err := in.Install(); err == nil || !strings.Contains(err.Error(), "writable by users other than root") {
		t.Fatalf("install into a world-writable directory: %v", err)
	}
}

// containerd and CRI-O freeze a container before they have runc dump it: the GPU step
// thaws it for the driver and leaves it frozen, as the engine does not expect otherwise.
func TestPreDumpThawsWhatTheEngineFroze(t *testing.T) {
	for _, fail := range []string{"", "checkpoint"} {
		t.Run("fail="+fail, func(t *testing.T) {
			p := testutil.StartSleeper(t)
			pid := p.Process.Pid
			testutil.FreezeInCgroup(t, pid)
			f := &fakeGPU{pid: pid, failStep: fail}
			err := newAction(t, f, "pre-dump", pid).act.Run(context.Background())
			want := []string{"lock", "checkpoint"}
			if fail != "" {
				want = append(want, "unlock") // the rollback, while still thawed
				if err == nil {
					t.Fatal("pre-dump succeeded with a failing GPU checkpoint")
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if got := f.log(); !slices.Equal(got, want) {
				t.Fatalf("GPU calls %v, want %v", got, want)
			}
			if c, err := freezer.Holding(pid); err != nil || c == nil {
				t.Fatalf("container left thawed after the GPU step (%v): the engine froze it", err)
			}
		})
	}
}

func TestPreDumpRefusesStoppedProcess(t *testing.T) {
	p := testutil.StartSleeper(t)
	pid := p.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100; i++ {
		if q, _ := proctree.Read(pid); q.State == 'T' {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	f := &fakeGPU{pid: pid}
	err := newAction(t, f, "pre-dump", pid).act.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "kill -CONT "+strconv.Itoa(pid)) {
		t.Fatalf("pre-dump of a stopped GPU process: %v; want a refusal saying how to let it run", err)
	}
	if got := f.log(); len(got) != 0 {
		t.Fatalf("GPU calls %v on a stopped process", got)
	}
	if q, _ := proctree.Read(pid); q.State != 'T' {
		t.Fatalf("process state %c after the refusal, want it left stopped", q.State)
	}
}

// After a dump that leaves the tree running, the engine thaws the container only once
// runc is done: the rollback waits for that instead of calling the driver on a frozen one.
func TestRollBackWaitsForTheEngineToThaw(t *testing.T) {
	p := testutil.StartSleeper(t)
	pid := p.Process.Pid
	f := &fakeGPU{pid: pid}
	a := newAction(t, f, "pre-dump", pid)
	if err := a.act.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	testutil.FreezeInCgroup(t, pid)
	done := make(chan error, 1)
	go func() {
		done <- RollBack(context.Background(), []gpu.Backend{f}, a.watched[0], slog.New(slog.DiscardHandler))
	}()
	select {
	case err := <-done:
		t.Fatalf("rollback ended while the container was frozen: %v (calls %v)", err, f.log())
	case <-time.After(300 * time.Millisecond):
	}
	c, err := freezer.Holding(pid)
	if err != nil || c == nil {
		t.Fatalf("not frozen: %v", err)
	}
	if err := c.Thaw(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := f.log(); !slices.Equal(got, []string{"lock", "checkpoint", "restore", "unlock"}) {
		t.Fatalf("GPU calls %v", got)
	}
}

// A GPU process that exits while the pre-dump looks at the tree (here: between being
// found and having its start time read, as a short-lived child holding a device file did
// in CI) does not fail the dump: the tree is read again, and the GPU processes still
// there are checkpointed.
func TestPreDumpReadsTheTreeAgainWhenAProcessExits(t *testing.T) {
	p := testutil.StartSleeper(t)
	f := &fakeGPU{pid: p.Process.Pid}
	a := newAction(t, f, "pre-dump", p.Process.Pid)
	exited := false
	procOf = func(pid int) (txn.Proc, error) {
		if !exited {
			exited = true
			return txn.Proc{}, fmt.Errorf("process %d: %w", pid, proctree.ErrNoProcess)
		}
		return txn.ProcOf(pid)
	}
	t.Cleanup(func() { procOf = txn.ProcOf })
	if err := a.act.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := f.log(); !slices.Equal(got, []string{"lock", "checkpoint"}) {
		t.Fatalf("GPU calls %v, want the process locked and checkpointed", got)
	}
}

// The GPU record is read from an image anyone may have made (a podman archive): only as a
// regular file inside the image, so a symlink to a file of root's, a FIFO (which would hang
// CRIU's restore, waiting on its script) or /dev/zero's endless bytes are refused.
func TestReadRecordReadsOnlyARegularFileInTheImage(t *testing.T) {
	for name, plant := range map[string]func(p string) error{
		"symlink": func(p string) error { return os.Symlink("/etc/hostname", p) },
		"fifo":    func(p string) error { return syscall.Mkfifo(p, 0o600) },
		"device":  func(p string) error { return os.Symlink("/dev/zero", p) },
		"large":   func(p string) error { return os.WriteFile(p, make([]byte, maxRecord+1), 0o600) },
	} {
		img := t.TempDir()
		if err := plant(filepath.Join(img, RecordName)); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { _, err := ReadRecord(img); done <- err }()
		select {
		case err := <-done:
			if err == nil || os.IsNotExist(err) {
				t.Errorf("%s as the GPU record: %v, want a refusal", name, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s as the GPU record: the read hangs", name)
		}
	}
}

// A GPU record from an image anyone may have made is checked as an image's GPU snapshots
// are: one that listed the nvidia backend twice had the GPU process of its second
// snapshot resumed with its GPU state left checkpointed (hostile test).
func TestReadRecordRefusesABackendListedTwice(t *testing.T) {
	img := t.TempDir()
	testutil.WriteFile(t, filepath.Join(img, RecordName),
		[]byte(`{"gpus":[{"backend":"nvidia"},{"backend":"nvidia","processes":[{"pid":7}]}]}`))
	if _, err := ReadRecord(img); err == nil || !strings.Contains(err.Error(), `GPU backend "nvidia" is listed twice`) {
		t.Fatalf("ReadRecord = %v, want the record refused", err)
	}
}

// A restore takes its bundle from the image, which anyone may have made, and runc runs the
// bundle's hooks as root: a bundle, or its config.json, that others can change is refused.
func TestCheckBundleRefusesWhatOthersCanChange(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "the test makes files of another user: it needs root")
	}
	mk := func(owner int) string {
		b := t.TempDir()
		if err := os.WriteFile(filepath.Join(b, "config.json"), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(b, owner, owner); err != nil {
			t.Fatal(err)
		}
		return b
	}
	if err := checkBundle(mk(0)); err != nil {
		t.Fatalf("a bundle of root's: %v", err)
	}
	if err := checkBundle(mk(65534)); err == nil || !strings.Contains(err.Error(), "hooks") {
		t.Errorf("a bundle of another user's: %v", err)
	}
	b := mk(0)
	if err := os.Chown(filepath.Join(b, "config.json"), 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := checkBundle(b); err == nil {
		t.Error("a bundle whose config.json is another user's was taken")
	}
}

// Once post-resume has read the GPU record, a failure of any step kills the restored tree:
// it runs already (CRIU only logs a failed post-resume), and must not run on without its GPU
// state. A hostile test's tree with a short-lived child failed the read of the tree, and
// post-resume returned with the container running and its GPU process checkpointed; here
// the record itself is damaged.
func TestPostResumeFailureKillsTheTree(t *testing.T) {
	p := testutil.StartSleeper(t)
	f := &fakeGPU{pid: p.Process.Pid}
	a := dumpedForRestore(t, f, p.Process.Pid)
	if err := a.act.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	kept, err := a.act.restorePath()
	if err != nil {
		t.Fatal(err)
	}
	testutil.WriteFile(t, kept, []byte("not JSON"))
	a.env[envAction], a.env[envInitPID] = "post-resume", strconv.Itoa(p.Process.Pid)
	if err := a.act.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "the restored processes were killed") {
		t.Fatalf("post-resume of a damaged record: %v", err)
	}
	if !testutil.ExitedWithin(p.Process.Pid, 5*time.Second) {
		t.Fatal("the restored tree runs on without its GPU state")
	}
}

// restoreHook is a fake driver whose restore lets the container's workload act first (it
// runs: post-resume comes after CRIU resumed it), then fails.
type restoreHook struct {
	*fakeGPU
	hook func()
}

func (r *restoreHook) Restore(context.Context, int, map[string]string) error {
	r.hook()
	return errors.New("restore failed (the workload made it fail)")
}

// A failed post-resume kills the restored processes it read, and only while they are the
// processes it read: during the GPU restore the workload runs, and a child that exits gives
// its PID to whoever comes next. A review's test had root SIGKILL an unrelated process
// started at that PID.
func TestPostResumeFailureKillsOnlyTheProcessesItRead(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: places a process at a PID")
	}
	root := exec.Command("sh", "-c", "sleep 100 & sleep 100 & wait")
	if err := root.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testutil.KillAndReap(root.Process.Pid) })
	var tree []proctree.Process
	for deadline := time.Now().Add(5 * time.Second); len(tree) < 3; time.Sleep(20 * time.Millisecond) {
		if tree, _ = proctree.Tree(root.Process.Pid); time.Now().After(deadline) {
			t.Fatal("the tree's children did not start")
		}
	}
	child := tree[1].PID
	f := &fakeGPU{pid: root.Process.Pid}
	a := dumpedForRestore(t, f, root.Process.Pid)
	if err := a.act.Run(context.Background()); err != nil { // pre-restore
		t.Fatal(err)
	}
	// The hook runs where the post-resume restores, maybe not on the test's goroutine: it
	// reports, the test fails after.
	var bystander *exec.Cmd
	var placed error
	a.act.Backends = []gpu.Backend{&restoreHook{fakeGPU: f, hook: func() {
		_ = syscall.Kill(child, syscall.SIGKILL)
		if !testutil.ExitedWithin(child, 5*time.Second) {
			placed = fmt.Errorf("the tree's child %d did not exit", child)
			return
		}
		bystander, placed = testutil.TryStartAt(t, child, "sleep", "100")
	}}}
	a.env[envAction], a.env[envInitPID] = "post-resume", strconv.Itoa(root.Process.Pid)
	if err := a.act.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "the restored processes were killed") {
		t.Fatalf("post-resume with a failing restore: %v", err)
	}
	if placed != nil {
		t.Fatal(placed)
	}
	if !testutil.ExitedWithin(root.Process.Pid, 5*time.Second) {
		t.Error("the restored tree runs on without its GPU state")
	}
	if bystander == nil || !testutil.Alive(bystander.Process.Pid) {
		t.Fatalf("the process that took the exited child's PID %d was killed", child)
	}
}

// A dump's rollback file is its CRIU's, by PID and start time: a watcher still waiting after
// its CRIU exited (for the engine to thaw, or for a resume to work) read and then removed
// whatever file bore that PID by then — a later CRIU's at the same PID — and that dump's
// GPUs stayed locked with no watcher to give them back (review).
func TestDumpRollbackFilesOfCRIUsAtOnePIDAreApart(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: places a process at a PID")
	}
	p := testutil.StartSleeper(t)
	f := &fakeGPU{pid: p.Process.Pid}
	first := testutil.StartSleeper(t) // stands for the first CRIU
	a := newAction(t, f, "pre-dump", p.Process.Pid)
	a.act.CRIUPID = first.Process.Pid
	if err := a.act.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	testutil.KillAndReap(first.Process.Pid)
	second := testutil.StartAt(t, first.Process.Pid, "sleep", "100") // a later CRIU at its PID
	f.state = gpu.StateRunning
	b := newAction(t, f, "pre-dump", p.Process.Pid)
	b.act.CRIUPID, b.act.StateDir = second.Process.Pid, a.act.StateDir
	if err := b.act.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(a.watched) != 1 || len(b.watched) != 1 || a.watched[0] == b.watched[0] {
		t.Fatalf("the two dumps' rollback files: %q and %q, want one each, apart", a.watched, b.watched)
	}
	f.state = gpu.StateCheckpointed
	if err := RollBack(context.Background(), []gpu.Backend{f}, a.watched[0], slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(b.watched[0]); err != nil {
		t.Fatalf("the first watcher's rollback took the second dump's file: %v", err)
	}
}

// A gpucr checkpoint of a container and a plain runc checkpoint of it through the script
// each locked the GPUs, and the second, failing, rolled back the first's (hostile test).
// The script locks the tree's processes as gpucr does: one a gpucr operation holds refuses
// the dump with nothing locked, and the locks it takes go to the watcher.
func TestPreDumpTakesGpucrsLocks(t *testing.T) {
	a, f, p := preDumpOfAGPUProcess(t, true)
	held, err := txn.LockTarget(a.act.RunDir, engine.PIDLock(p.Process.Pid), "gpucr PID 1 is running a checkpoint of container c2")
	if err != nil {
		t.Fatal(err)
	}
	err = a.act.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "checkpoint of container c2") {
		t.Fatalf("pre-dump beside a gpucr checkpoint = %v, want it refused, naming that", err)
	}
	if calls := f.log(); len(calls) != 0 || len(a.watched) != 0 {
		t.Fatalf("GPU calls %v, watchers %v: want nothing done", calls, a.watched)
	}
	held.Release()

	var handed []*os.File
	a.act.Watch = func(_ int, heldPath string, locks []*os.File) error {
		a.watched = append(a.watched, heldPath)
		for _, l := range locks { // as the watcher does: its own copies
			fd, err := syscall.Dup(int(l.Fd()))
			if err != nil {
				return err
			}
			handed = append(handed, os.NewFile(uintptr(fd), l.Name()))
		}
		return nil
	}
	if err := a.act.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(handed) != 1 {
		t.Fatalf("the watcher was handed %d locks, want the process's one", len(handed))
	}
	if _, err := txn.LockTarget(a.act.RunDir, engine.PIDLock(p.Process.Pid), "gpucr"); !errors.Is(err, txn.ErrBusy) {
		t.Fatalf("a gpucr operation on the process while the watcher holds it: %v, want ErrBusy", err)
	}
	_ = handed[0].Close() // the watcher is done
	l, err := txn.LockTarget(a.act.RunDir, engine.PIDLock(p.Process.Pid), "gpucr")
	if err != nil {
		t.Fatalf("once the watcher is done: %v", err)
	}
	l.Release()
}

// A tree whose GPUs another operation has checkpointed holds no device file of theirs: its
// dump went through unrefused (review). Without GPU processes the locks are looked at too,
// and let go of (their files removed) when free.
func TestPreDumpWithoutGPUsHonoursGpucrsLocks(t *testing.T) {
	a, _, p := preDumpOfAGPUProcess(t, false) // the tree holds no GPU
	held, err := txn.LockTarget(a.act.RunDir, engine.PIDLock(p.Process.Pid), "gpucr PID 1 is running a checkpoint of container c2")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.act.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "checkpoint of container c2") {
		t.Fatalf("pre-dump of a tree another operation holds = %v, want it refused", err)
	}
	held.Release()
	if err := a.act.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(filepath.Join(a.act.RunDir, "locks")); len(entries) != 0 {
		t.Errorf("locks left: %v", entries)
	}
}

// A gpucr restore of a container holds its processes by its record, not by their PIDs'
// locks, until their GPUs run again: a plain runc dump in that window locked and
// checkpointed what the restore was resuming. The dump is refused, nothing locked.
func TestPreDumpRefusesAProcessALiveRestoreHolds(t *testing.T) {
	a, f, p := preDumpOfAGPUProcess(t, true)
	j, err := txn.Begin(a.act.RunDir, txn.OpRestore, "container c2")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = j.End() }()
	proc, err := txn.ProcOf(p.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Update(func(r *txn.Record) { r.GPUs = []txn.GPUProc{{Backend: "nvidia", Proc: proc}} }); err != nil {
		t.Fatal(err)
	}
	err = a.act.Run(context.Background())
	if !errors.Is(err, txn.ErrBusy) || !strings.Contains(err.Error(), "restore of container c2") {
		t.Fatalf("pre-dump beside a live restore = %v, want it refused, naming that", err)
	}
	if calls := f.log(); len(calls) != 0 || len(a.watched) != 0 {
		t.Fatalf("GPU calls %v, watchers %v: want nothing done", calls, a.watched)
	}
	if entries, _ := os.ReadDir(filepath.Join(a.act.RunDir, "locks")); len(entries) != 0 {
		t.Errorf("locks left: %v", entries)
	}
}

// A pre-dump that fails before its watcher holds the locks lets go of them and removes
// their files: left, every later dump of those PIDs started gpucr for them.
func TestPreDumpFailingBeforeItsWatcherLeavesNoLock(t *testing.T) {
	a, f, _ := preDumpOfAGPUProcess(t, true)
	a.act.Watch = func(int, string, []*os.File) error { return errors.New("no watcher") }
	if err := a.act.Run(context.Background()); err == nil {
		t.Fatal("pre-dump without its watcher succeeded")
	}
	if entries, _ := os.ReadDir(filepath.Join(a.act.RunDir, "locks")); len(entries) != 0 {
		t.Errorf("locks left: %v", entries)
	}
	if calls := f.log(); len(calls) != 0 {
		t.Errorf("GPU calls %v before the watcher ran", calls)
	}
}

// preDumpOfAGPUProcess is the pre-dump of a sleeper's tree, with gpucr's run directory
// and, with gpu, the sleeper's GPU state held by a fake backend.
func preDumpOfAGPUProcess(t *testing.T, gpu bool) (*actionEnv, *fakeGPU, *exec.Cmd) {
	t.Helper()
	p := testutil.StartSleeper(t)
	f := &fakeGPU{pid: -1}
	if gpu {
		f.pid = p.Process.Pid
	}
	a := newAction(t, f, "pre-dump", p.Process.Pid)
	a.act.RunDir = t.TempDir()
	return a, f, p
}

// CRIU refuses a configuration file with a line whose value it cannot parse, and runc
// with it, before any step: an integration installed at a script path with a space stopped
// every runc checkpoint and restore of the host, and a TMPDIR with one had every
// `restore --container` fail with runc's "CRIU version check failed" (hostile test). Both
// are refused in one line naming the path, before anything is written.
func TestCRIUConfigurationNamesOnlyPathsItCanParse(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "runc.conf")
	if err := os.WriteFile(conf, []byte("tcp-established\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, script := range []string{"lib dir/criu-action", "lib#1/criu-action", "lib\"/criu-action"} {
		in := Integration{Config: conf, Script: filepath.Join(dir, script), Log: filepath.Join(dir, "action.log"),
			Gpucr: fakeGpucr(t, filepath.Join(dir, "ran"))}
		if err := in.Install(); err == nil || !strings.Contains(err.Error(), "configuration file") {
			t.Errorf("install of %q: %v, want a refusal", script, err)
		}
	}
	if b, _ := os.ReadFile(conf); string(b) != "tcp-established\n" {
		t.Fatalf("configuration after refused installs: %q", b)
	}
	work := filepath.Join(t.TempDir(), "tmp dir")
	if err := os.Mkdir(work, 0o700); err != nil {
		t.Fatal(err)
	}
	if env, err := postRestoreHook(work, "/usr/local/bin/gpucr", txn.Proc{PID: 1, Start: 1}); err == nil || strings.Contains(err.Error(), "\n") {
		t.Fatalf("post-restore hook in %q: %v %v, want one line refusing it", work, env, err)
	}
}

// CRIU splits a configuration line at C's white space, ASCII only: a path with a no-break
// space (U+00A0, bytes CRIU reads as any other) was refused, its refusal naming half a
// character ("\xc2"). It is taken; an ASCII one is still refused, named whole.
func TestCRIUConfigurationPathsRefuseOnlyCRIUsSpaces(t *testing.T) {
	if err := checkCRIUConfigPath("/srv/lib\u00a0dir/criu-action"); err != nil {
		t.Errorf("a path with a no-break space: %v, want it taken", err)
	}
	if err := checkCRIUConfigPath("/srv/lib\tdir/criu-action"); err == nil || !strings.Contains(err.Error(), `no "\t"`) {
		t.Errorf("a path with a tab: %v, want it refused, naming the tab", err)
	}
}

// A dump through the runtime's own CRIU, which loads no plugin of gpucr's, refuses a
// process whose device files only gpucr's plugin carries before any GPU is locked: it
// went on, and the runtime's CRIU would have failed on those files.
func TestPreDumpRefusesFilesOnlyThePluginCarries(t *testing.T) {
	p := testutil.StartSleeper(t)
	f := &fakeGPU{pid: -1}
	a := newAction(t, f, "pre-dump", p.Process.Pid)
	a.act.Backends = []gpu.Backend{&gputest.Carrier{Checkpointer: f, Holder: p.Process.Pid}}
	err := a.act.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "gpucr checkpoint --container") {
		t.Fatalf("pre-dump = %v, want a refusal saying how such a container is checkpointed", err)
	}
	if got := f.log(); len(got) != 0 {
		t.Fatalf("GPU calls %v, want none", got)
	}
}

// planPlugin is fakeGPU whose restore of device files held without device state needs its
// CRIU plugin, as the NVIDIA backend's does once gpucr's plugin is installed.
type planPlugin struct{ *fakeGPU }

func (p planPlugin) PlanRestore(_ context.Context, in gpu.RestoreInput) (*gpu.Plan, error) {
	if in.Snapshot == nil || len(in.Snapshot.FileHolders) == 0 {
		return nil, nil
	}
	return &gpu.Plan{PluginDir: "/plugins"}, nil
}

// A restore through the runtime's own CRIU of an image with processes whose device files
// only gpucr's plugin opens again says to restore it with gpucr, which does so in a
// container: it said containers with such GPUs were not supported.
func TestPreRestoreSaysHowFilesOnlyThePluginOpensAreRestored(t *testing.T) {
	f := &fakeGPU{pid: -1}
	a := newAction(t, f, "pre-restore", 0)
	a.env[envInitPID] = ""
	a.act.Backends = []gpu.Backend{planPlugin{f}}
	rec := Record{GpucrVersion: "test", GPUs: []gpu.Snapshot{{Host: gpu.Host{Backend: f.Name()}, Processes: []gpu.Process{{PID: 7}}, FileHolders: []int{8}}}}
	b, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	testutil.WriteFile(t, filepath.Join(a.env[envImageDir], RecordName), b)
	err = a.act.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "gpucr restore --container") {
		t.Fatalf("pre-restore = %v, want a refusal saying how such an image is restored", err)
	}
}
