package container

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpucr/gpucr/internal/beneath"
	"github.com/gpucr/gpucr/internal/crashpoint"
	"github.com/gpucr/gpucr/internal/engine"
	"github.com/gpucr/gpucr/internal/freezer"
	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/safety"
	"github.com/gpucr/gpucr/internal/txn"
)

// What CRIU tells an action script through its environment (criu/action-scripts.c).
const (
	envAction   = "CRTOOLS_SCRIPT_ACTION"
	envInitPID  = "CRTOOLS_INIT_PID"
	envImageDir = "CRTOOLS_IMAGE_DIR"
)

// RecordName is the file the action script adds to CRIU's image directory when the dumped
// tree held GPU state: what was on which GPUs, for the restore to check and bring back.
const RecordName = "gpucr-gpus.json"

// Record is the content of RecordName. Processes are numbered as in the container.
type Record struct {
	GpucrVersion string         `json:"gpucrVersion"`
	GPUs         []gpu.Snapshot `json:"gpus"`
}

// maxRecord bounds a GPU record: a few GPUs and processes take kilobytes.
const maxRecord = 4 << 20

// ReadRecord reads the GPU record of a CRIU image directory; os.ErrNotExist means the
// dump held no GPU state (or was not taken with the integration). The directory may be an
// image anyone made (a podman archive): the record is read only as a regular file inside it,
// no symlink followed, no FIFO waited on, at most maxRecord bytes.
func ReadRecord(dir string) (*Record, error) {
	b, err := beneath.ReadFile(dir, RecordName, maxRecord)
	if err != nil {
		return nil, err
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("read %s: %w", filepath.Join(dir, RecordName), err)
	}
	// Checked as an image's GPU snapshots are: a record that repeats a backend had its
	// second snapshot's processes resumed with their GPU state left checkpointed.
	if reason := gpu.Problem(r.GPUs); reason != "" {
		return nil, fmt.Errorf("read %s: %s", filepath.Join(dir, RecordName), reason)
	}
	return &r, nil
}

// Action is gpucr's CRIU action script: CRIU runs it at each step of a dump or restore,
// which lets a plain `runc checkpoint` / `runc restore` move GPU state with no change to
// runc. CRIU runs each script of a configuration file twice per step in RPC mode (it reads
// the file twice), so every step is idempotent.
type Action struct {
	Backends    []gpu.Backend
	Getenv      func(string) string
	CRIUPID     int    // the CRIU process that runs the script: its parent
	StateDir    string // holds what passes from one step to a later one
	LockTimeout time.Duration
	Version     string
	Log         *slog.Logger
	// RunDir is gpucr's run directory, where its operations lock what they work on ("" for
	// none): a dump through the script locks its processes there as gpucr's own do.
	RunDir string
	// Watch starts, detached, what rolls the GPUs back once CRIU exits (RollBack): CRIU
	// runs no script when a dump fails, and a tree dumped with --leave-running is still
	// frozen at post-dump, where its GPUs cannot be resumed. It hands the watcher locks,
	// which it holds until its rollback is done.
	Watch func(criuPID int, heldPath string, locks []*os.File) error
}

// Run does what the current step (CRTOOLS_SCRIPT_ACTION) needs, logging one line. An error
// makes CRIU abort the dump or restore.
func (a *Action) Run(ctx context.Context) error {
	step := a.Getenv(envAction)
	log := a.Log.With("action", step, "init", a.Getenv(envInitPID), "criu", a.CRIUPID)
	if a.Getenv(ActionSkipEnv) == "skip" {
		log.Info("skipped: gpucr drives this runc call and moves the GPU state itself")
		return nil
	}
	var err error
	switch step {
	case "pre-dump":
		err = a.preDump(ctx, log)
	case "pre-restore":
		err = a.preRestore(ctx, log)
	case "post-resume":
		err = a.postResume(ctx, log)
	default:
		log.Debug("nothing to do")
	}
	if err != nil {
		log.Error("failed", "err", err)
	}
	return err
}

func (a *Action) initPID() (int, error) {
	pid, err := strconv.Atoi(a.Getenv(envInitPID))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("CRIU gave no usable %s (%q)", envInitPID, a.Getenv(envInitPID))
	}
	return pid, nil
}

// findGPUs reads the tree of the container's first process root and finds its GPU
// processes, each with its start time; an error that matches proctree.ErrNoProcess means a
// process exited meanwhile and the tree is worth reading again.
func (a *Action) findGPUs(ctx context.Context, root int) (engine.Found, []txn.GPUProc, []proctree.Process, error) {
	tree, err := proctree.Tree(root)
	if err != nil {
		return engine.Found{}, nil, nil, err
	}
	// runc gives a restored container its standard descriptors again: its pipes to the
	// runtime are no outer pipes; the files it maps shared are in its own /dev/shm, which
	// CRIU saves with it; and whether CRIU takes TCP connections is runc's to say.
	skips := safety.Skips{safety.CheckOuterPipe: true, safety.CheckSharedFile: true, safety.CheckTCP: true}
	found, err := engine.Inspect(ctx, a.Backends, nil, proctree.Snap("/proc", tree), skips)
	if err != nil {
		return engine.Found{}, nil, nil, err
	}
	if len(found.Plugins) > 0 {
		p := found.Plugins[0]
		return engine.Found{}, nil, nil, fmt.Errorf("process %d holds %s GPU state, which CRIU's plugin saves: containers with such GPUs are not supported yet", p.PID, p.Backend.Name())
	}
	// The runtime's CRIU loads no plugin of gpucr's: it would fail on the device files
	// only gpucr's plugin carries, once the GPUs were locked and checkpointed.
	if len(found.Carriers) > 0 {
		c := found.Carriers[0]
		return engine.Found{}, nil, nil, fmt.Errorf("process %d holds %s device files without device state (a child forked after its parent started using the GPU, as a PyTorch DataLoader worker is), which gpucr's CRIU plugin carries only through gpucr checkpoint --container, not through the runtime's own checkpoint", c.PID, c.Backend.Name())
	}
	found = found.DropExited()
	held := make([]txn.GPUProc, len(found.GPUs))
	for i, p := range found.GPUs {
		proc, err := procOf(p.PID)
		if err != nil {
			return engine.Found{}, nil, nil, err
		}
		held[i] = txn.GPUProc{Backend: p.Backend.Name(), Proc: proc}
	}
	return found, held, tree, nil
}

// procOf is txn.ProcOf; tests make a process exit at this point.
var procOf = txn.ProcOf

// preDump locks and checkpoints the GPUs of the tree CRIU is about to freeze, records
// them in the image, and starts the rollback watcher. Any failure rolls the GPUs back and
// aborts the dump: the container keeps running.
func (a *Action) preDump(ctx context.Context, log *slog.Logger) (err error) {
	// A record already in the image is an earlier dump's (runc's image path defaults to
	// ./checkpoint, podman keeps a checkpoint's directory): this dump writes its own, or
	// none. A hostile test's second dump took the first's as its own, skipped the GPUs, and
	// its container was dumped and removed with its GPU state nowhere. (CRIU runs the script
	// twice a step; the script itself stops the second run.)
	imgDir := a.Getenv(envImageDir)
	record := filepath.Join(imgDir, RecordName)
	if err := os.Remove(record); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove an earlier dump's %s from the image: %w", RecordName, err)
	}
	root, err := a.initPID()
	if err != nil {
		return err
	}
	// A process of the container can exit while it is being looked at (a short-lived
	// child holding a device file): the tree is then read again, without it.
	var found engine.Found
	var held []txn.GPUProc
	var tree []proctree.Process
	for try := 0; ; try++ {
		found, held, tree, err = a.findGPUs(ctx, root)
		if !errors.Is(err, proctree.ErrNoProcess) || try == 4 {
			break
		}
	}
	if err != nil {
		return err
	}
	// The tree's processes are locked as gpucr's own checkpoints lock them: a gpucr
	// checkpoint of the same container and this dump each locked the GPUs, and the one
	// that came second, failing, rolled back the other's (hostile test). A tree whose GPUs
	// another operation has checkpointed holds no device file any more, and is refused so
	// too (review). The watcher holds the locks from the GPU steps on until its rollback is
	// done; this process lets go of its copies when it exits.
	locks, err := a.lockTree(tree)
	if err != nil {
		return err
	}
	gpus, snaps := found.GPUs, found.Snapshots
	if len(gpus) == 0 {
		for _, l := range locks {
			l.Release()
		}
		log.Info("no GPU processes", "processes", len(tree), "gpuProcesses", 0)
		return nil
	}
	files := make([]*os.File, len(locks))
	for i, l := range locks {
		files[i] = l.File()
	}
	handed := false // to the watcher, which removes their files when done
	defer func() {
		if handed {
			closeAll(files)
			return
		}
		for _, l := range locks {
			l.Release()
		}
	}()
	inner, err := toInner(gpus)
	if err != nil {
		return err
	}
	rec, err := json.MarshalIndent(Record{GpucrVersion: a.Version, GPUs: innerSnapshots(snaps, inner)}, "", "  ")
	if err != nil {
		return err
	}
	heldPath, err := a.statePath("dump")
	if err != nil {
		return err
	}
	if err := writeJSON(heldPath, held); err != nil {
		return err
	}
	// The watcher goes first: from the lock on, CRIU's exit, however it ends, rolls back
	// (again, harmlessly, after the script's own rollback) and removes heldPath.
	if err := a.Watch(a.CRIUPID, heldPath, files); err != nil {
		os.Remove(heldPath)
		return fmt.Errorf("start the GPU rollback watcher: %w", err)
	}
	handed = true
	// The same GPU steps and rollback as gpucr's own checkpoints.
	var undo engine.Undo
	defer func() { err = undo.Unwind(ctx, err) }()
	if err := thawForDriver(found.Frozen, &undo, log); err != nil {
		return err
	}
	if _, err := engine.CheckpointGPUs(ctx, new(engine.Timer), gpus, a.LockTimeout, &undo); err != nil {
		return err
	}
	if err := writeNew(record, append(rec, '\n')); err != nil {
		return fmt.Errorf("write %s into the image: %w", RecordName, err)
	}
	crashpoint.Hit("end pre-dump")
	undo.Commit()
	log.Info("GPU state checkpointed", "processes", len(tree), "gpuProcesses", len(gpus))
	return nil
}

// lockTree takes gpucr's target locks on the processes of tree, all or none; none without
// a run directory.
func (a *Action) lockTree(tree []proctree.Process) ([]*txn.Lock, error) {
	if a.RunDir == "" {
		return nil, nil
	}
	holder := fmt.Sprintf("a dump by runc's CRIU (PID %d) through gpucr's action script, until its GPUs are resumed", a.CRIUPID)
	names := make([]string, len(tree))
	for i, p := range tree {
		names[i] = engine.PIDLock(p.PID)
	}
	locks, refused, err := txn.LockTargets(a.RunDir, holder, names)
	if errors.Is(err, txn.ErrBusy) {
		return nil, fmt.Errorf("process %d of the container: %w; the dump is refused and the container runs on", tree[refused].PID, err)
	}
	if err != nil {
		return nil, err
	}
	// A gpucr restore of the container holds its processes by its record until their GPUs
	// run again: a dump then would lock what that restore is resuming.
	for _, p := range tree {
		en, err := txn.HoldingGPU(a.RunDir, p.PID)
		if err == nil && en != nil {
			err = fmt.Errorf("process %d of the container: %w: the %s of %s holds its GPU state; the dump is refused and the container runs on", p.PID, txn.ErrBusy, en.Op, en.Target)
		}
		if err != nil {
			for _, l := range locks {
				l.Release()
			}
			return nil, err
		}
	}
	return locks, nil
}

// closeAll closes files, leaving the locks on them to whoever else holds them.
func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// thawForDriver lets the GPU processes an engine froze before its dump (containerd and
// CRI-O do, for a consistent copy of the root filesystem) run for the driver's lock and
// checkpoint, and freezes them again afterwards, as the engine left them, whether the GPU
// steps worked or were rolled back.
func thawForDriver(frozen []*engine.FrozenError, undo *engine.Undo, log *slog.Logger) error {
	for _, f := range frozen {
		c := f.Cgroup
		undo.Always("freeze cgroup "+c.Dir+" again, as the engine left it", func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), refreezeTimeout)
			defer cancel()
			return c.Freeze(ctx)
		})
		if err := c.Thaw(); err != nil {
			return err
		}
		log.Info("thawed for the GPU driver, frozen again after it", "cgroup", c.Dir, "gpuProcess", f.PID)
	}
	return nil
}

// refreezeTimeout bounds the wait for every process of a thawed cgroup to be frozen again.
const refreezeTimeout = 30 * time.Second

// waitThawed waits until no process of set is frozen with its cgroup: after a dump that
// left the tree running, the engine that froze it thaws it only once runc is done, and the
// driver's resume of a frozen process would wait for that anyway, unbounded and unlogged.
func waitThawed(ctx context.Context, set engine.GPUSet, log *slog.Logger) error {
	for _, p := range set {
		logged := false
		for {
			c, err := freezer.Holding(p.PID)
			if errors.Is(err, fs.ErrNotExist) || c == nil {
				break // thawed, or gone
			}
			if err != nil {
				return err
			}
			if !logged {
				log.Info("waiting for the engine to thaw the container before resuming its GPUs", "cgroup", c.Dir, "gpuProcess", p.PID)
				logged = true
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("GPU process %d still frozen with cgroup %s: %w", p.PID, c.Dir, ctx.Err())
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

// RollBack runs once the dumping CRIU has exited: every process of heldPath still alive
// (the dump failed, or left the tree running) gets its GPU state back and is unlocked; a
// process the dump killed is gone and needs nothing.
func RollBack(ctx context.Context, backends []gpu.Backend, heldPath string, log *slog.Logger) error {
	var held []txn.GPUProc
	b, err := os.ReadFile(heldPath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // the script rolled back itself before the dump started
	}
	if err != nil {
		return fmt.Errorf("read GPU rollback state: %w", err)
	}
	if err := json.Unmarshal(b, &held); err != nil {
		return fmt.Errorf("read GPU rollback state %s: %w", heldPath, err)
	}
	set, err := engine.HeldSet(backends, held)
	if err != nil {
		return err
	}
	log.Info("dump over", "gpuProcesses", len(held), "stillRunning", len(set))
	if err := waitThawed(ctx, set, log); err != nil {
		return err
	}
	if err := set.ResumeRetrying(ctx, nil, engine.GPURetryWait); err != nil {
		return fmt.Errorf("resume GPU processes after the dump: %w", err)
	}
	return os.Remove(heldPath)
}

// preRestore checks, before CRIU restores anything, that this host's GPUs can take the
// image's GPU state, and keeps the record for post-resume: by then CRIU has closed the
// image directory.
func (a *Action) preRestore(ctx context.Context, log *slog.Logger) error {
	rec, err := ReadRecord(a.Getenv(envImageDir))
	if errors.Is(err, fs.ErrNotExist) {
		log.Info("the image holds no GPU state")
		return nil
	}
	if err != nil {
		return err
	}
	skips, err := a.skips()
	if err != nil {
		return err
	}
	plan, err := engine.PlanGPUs(ctx, a.Backends, nil, rec.GPUs, gpu.RestoreInput{CRIUDir: a.Getenv(envImageDir), Skips: skips})
	if err != nil {
		return err
	}
	if plan.PluginMemory {
		return errors.New("the image holds GPU state that a CRIU plugin restores: containers with such GPUs are not supported yet")
	}
	// As at pre-dump: gpucr restores those files (a forked DataLoader worker's) in a
	// container, through its own runc call, which names its plugin to CRIU.
	if plan.PluginDir != "" {
		return errors.New("the image holds processes whose device files only gpucr's CRIU plugin opens again, which the runtime's own CRIU does not load: restore it with gpucr restore --container")
	}
	log.Info("GPU state can be restored here", "backends", len(rec.GPUs))
	a.sweep(log)
	kept, err := a.restorePath()
	if err != nil {
		return err
	}
	return writeJSON(kept, rec)
}

// postResume brings back the device state of the restored, now running, tree. If that
// fails the tree is killed: a process without its GPU state must not run on.
func (a *Action) postResume(ctx context.Context, log *slog.Logger) error {
	var rec Record
	kept, err := a.restorePath()
	if err != nil {
		return err
	}
	b, err := os.ReadFile(kept)
	if errors.Is(err, fs.ErrNotExist) {
		log.Info("no GPU state to restore")
		return nil
	}
	if err != nil {
		return err
	}
	os.Remove(kept)
	root, err := a.initPID()
	if err != nil {
		return err // no tree to name
	}
	// From here the tree holds GPU state: whatever fails, it must not run on without it (it
	// runs already: CRIU only logs a failed post-resume). A hostile test's short-lived child
	// failed the read of the tree, and the container ran on with its GPU checkpointed.
	// The tree is read once, with each process's start: the workload runs during the GPU
	// restore, and a process of it that exits meanwhile can give its PID to one outside the
	// container, which a kill by PID alone would take (a review's test did so). Processes
	// forked since go with the container's init where it is its PID namespace's first
	// process (killing it takes the namespace down); in a shared PID namespace they remain.
	tree, treeErr := proctree.Tree(root)
	fail := func(cause error) error {
		for _, p := range tree {
			if proctree.Same(p.PID, p.Start) {
				_ = syscall.Kill(p.PID, syscall.SIGKILL)
			}
		}
		return fmt.Errorf("%w: %v; the restored processes were killed", engine.ErrGPURestore, cause)
	}
	if treeErr != nil {
		return fail(treeErr)
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return fail(fmt.Errorf("read %s: %w", kept, err))
	}
	host, err := proctree.HostPIDs(root)
	if err != nil {
		return fail(err)
	}
	skips, err := a.skips()
	if err != nil {
		return fail(err)
	}
	// Onto the GPUs the container was given on this host, whichever it had before.
	plan, err := engine.PlanGPUs(ctx, a.Backends, nil, rec.GPUs, gpu.RestoreInput{Root: fmt.Sprintf("/proc/%d/root", root), Skips: skips})
	if err != nil {
		return fail(err)
	}
	plan.LogMoves(log)
	gpus, remap := plan.GPUs, plan.Remap
	if gpus, err = gpus.Renumber(host); err != nil {
		return fail(err)
	}
	for _, pid := range gpus.PIDs() {
		if !slices.ContainsFunc(tree, func(p proctree.Process) bool { return p.PID == pid && proctree.Same(p.PID, p.Start) }) {
			return fail(fmt.Errorf("GPU process %d exited before its GPU state was restored", pid))
		}
	}
	if err := gpus.Resume(context.WithoutCancel(ctx), remap); err != nil {
		return fail(err)
	}
	log.Info("GPU state restored", "gpuProcesses", len(gpus))
	return nil
}

// skips are the checks switched off through their environment variables, the one way to
// reach a script that runc starts.
func (a *Action) skips() (gpu.Skips, error) {
	return gpu.SkipsFrom(gpu.Vendors(), nil, a.Getenv)
}

// restorePath is where pre-restore keeps the image's GPU record for post-resume: a record
// a failed restore left is never taken by a later CRIU at the same PID (a hostile test had
// a stale one restored into, and kill, a container without GPU state).
func (a *Action) restorePath() (string, error) { return a.statePath("restore") }

// statePath is where this CRIU's script keeps what a step hands on (kind "dump": the GPU
// processes the watcher rolls back; "restore": the record post-resume restores), named by
// the CRIU's PID and start time, never by the PID alone: a watcher still waiting after its
// CRIU exited would otherwise read, or remove, the file of a later CRIU at the same PID,
// leaving that dump's GPUs locked (review, 2026-11-26).
func (a *Action) statePath(kind string) (string, error) {
	p, err := proctree.Read(a.CRIUPID)
	if err != nil {
		return "", fmt.Errorf("CRIU, PID %d: %w", a.CRIUPID, err)
	}
	return filepath.Join(a.StateDir, fmt.Sprintf("%s-%d.%d.json", kind, a.CRIUPID, p.Start)), nil
}

// stateOwner is the CRIU, by PID and start time, that a file of the state directory
// belongs to: a restore's record (restore-PID.START.json) or the script's mark of a step
// it ran (PID.START.STEP).
func stateOwner(name string) (pid int, start uint64, ok bool) {
	n, _ := fmt.Sscanf(strings.TrimPrefix(name, "restore-"), "%d.%d.", &pid, &start)
	return pid, start, n == 2
}

// sweep removes from the state directory what CRIUs that are gone left there — a failed
// restore's record, the script's marks of the steps it ran — named, as they all are, by
// their CRIU's PID and start time.
func (a *Action) sweep(log *slog.Logger) {
	entries, err := os.ReadDir(a.StateDir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if pid, start, ok := stateOwner(e.Name()); !ok || proctree.Same(pid, start) {
			continue
		}
		if err := os.Remove(filepath.Join(a.StateDir, e.Name())); err == nil {
			log.Info("removed what a CRIU that is gone left", "file", e.Name())
		}
	}
}

// writeNew writes b into a new file at path, following no symlink there.
func writeNew(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	return errors.Join(err, f.Close())
}

func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Dir(path), err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
