package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpucr/gpucr/internal/criu"
	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/memfill"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/safety"
	"github.com/gpucr/gpucr/internal/signing"
	"github.com/gpucr/gpucr/internal/txn"
)

// RestoreRequest is what to restore and how.
type RestoreRequest struct {
	Dir string
	// GPUMap is the user's --gpu-map ("0=1,1=0" or UUIDs); empty: same GPUs where present.
	GPUMap string
	// Skips switches off GPU compatibility checks, per backend (--skip-check, NV_*_CHECK).
	Skips gpu.Skips
	// CRIURestoresPages leaves the memory in CRIU's files to CRIU instead of gpucr writing
	// the large runs itself: slower, kept to compare the two (restore --criu-restores-pages).
	// Memory gpucr saved itself at checkpoint is always gpucr's to write.
	CRIURestoresPages bool
	// Trust, when not empty, refuses an image not signed by one of its keys.
	Trust signing.Keys
	// Streamed, when set, is where the memory gpucr saved (criuimg.MemDir) comes from
	// instead of Dir, which then holds the image's other files (see stream.go).
	Streamed *Streamed
	criu.Options
}

// RestoreResult says what came back.
type RestoreResult struct {
	RootPID  int                          `json:"rootPid"`
	SignedBy string                       `json:"signedBy,omitempty"` // the trusted key that signed the image
	Manifest *image.Manifest              `json:"-"`
	GPUMap   map[string]map[string]string `json:"gpuMap,omitempty"` // backend -> image device -> host device
	Phases   []image.Phase                `json:"phases"`
	// CRIUStats is CRIU's own account of the restore.
	CRIUStats *criuimg.RestoreStats `json:"criuRestoreStats,omitempty"`
}

// Restore restores the image at r.Dir as target. Every target — a process tree, a
// container — goes through this one sequence: the image and this host checked before
// anything changes, CRIU's files verified before CRIU parses them, the memory verified
// while CRIU restores and filled before any task resumes, then the device state. A restore
// that cannot finish is removed: nothing is left half-running.
func (e *Engine) Restore(ctx context.Context, target RestoreTarget, r RestoreRequest) (res *RestoreResult, err error) {
	if err := CanRestoreHere(); err != nil {
		return nil, err
	}
	if dir, err := image.Resolve(r.Dir); err == nil {
		r.Dir = dir // read through one path, fixed now: see image.Resolve
	}
	m, signer, err := image.LoadTrusted(r.Dir, r.Trust)
	if errors.Is(err, signing.ErrUntrusted) {
		return nil, fmt.Errorf("%s: %w", r.Dir, err)
	}
	if err != nil {
		return nil, err
	}
	// CRIU only ever parses verified files: sizes and every file but the raw memory are
	// checked first. CRIU's page files are checked while CRIU restores, and the memory gpucr
	// saved itself (nearly all of a GPU image) by the fill as it reads it: no task resumes
	// until all of it passed, and CRIU kills the tasks if not.
	start := time.Now()
	local := r.Streamed.localFiles(m.Files)
	meta, memory := splitMemory(local)
	filled, memory := splitFilled(memory)
	if err := image.CheckListed(r.Dir, m); err != nil {
		return nil, err
	}
	if err := image.CheckSizes(r.Dir, local); err != nil {
		return nil, err
	}
	// root is where the image's files but its memory are read, checked and restored from:
	// the image itself, or private copies where others could change them under the restore.
	root, private, err := e.pin(r.Dir, local)
	if err != nil {
		return nil, err
	}
	var owned []string
	if private != nil {
		defer func() {
			if err := private.Close(); err != nil {
				e.Logger().Warn("the image's private copy is left for the next gpucr to remove", "err", err)
			}
		}()
		owned = []string{private.Dir}
	}
	if err := target.Open(ctx, root, m); err != nil {
		return nil, err
	}
	op, err := e.beginRestore(target, r.Streamed, owned...)
	if err != nil {
		return nil, err
	}
	defer op.End()
	t := e.NewTimer(op)
	if root != r.Dir {
		pinnedFiles, _ := image.SplitPinned(local)
		if err := image.CheckSizes(root, pinnedFiles); err != nil {
			return nil, err
		}
	}
	if err := image.CheckSums(root, meta); err != nil {
		return nil, err
	}
	if err := memfill.CheckPages(image.CRIUPath(root)); err != nil {
		return nil, err
	}
	verify := startVerify(root, r.Dir, memory, time.Since(start))
	defer func() { _ = verify.wait() }() // never leave it reading the image after we return; its verdict was taken where it mattered
	// The semaphores CRIU restores through links it left beside them, which each restore
	// consumes, are made again from the image first: the check below asks for the files.
	if len(m.LinkedFiles) > 0 && !target.CarriesSemaphores() {
		return nil, verify.prefer(fmt.Errorf("%w: the image lists semaphores a process tree's checkpoint carries (linkedFiles), which %s does not make", image.ErrCorrupt, target.What()))
	}
	unlink, err := placeLinked(m.LinkedFiles, func(links []string) error {
		return op.Update(func(rec *txn.Record) { rec.Paths = append(rec.Paths, links...) })
	})
	if err != nil {
		return nil, verify.prefer(err)
	}
	defer func() {
		if res == nil {
			if err := unlink(); err != nil {
				e.Logger().Warn("a semaphore's file or link the restore made is left in "+safety.ShmDir, "err", err)
			}
		}
	}()
	if err := target.Check(); err != nil {
		return nil, verify.prefer(err)
	}
	if strings.TrimSpace(r.GPUMap) != "" && len(m.GPUs) == 0 {
		// Nothing would read it, and a mistyped map of a job thought to be a GPU's went
		// unnoticed (hostile test).
		return nil, verify.prefer(fmt.Errorf("%w: --gpu-map %q: the image holds no GPU state to move", ErrBadRequest, r.GPUMap))
	}
	plan, err := PlanGPUs(ctx, e.Backends, e.Off, m.GPUs, gpu.RestoreInput{CRIUDir: image.CRIUPath(root), GPUMap: r.GPUMap, Skips: r.Skips})
	if err != nil {
		return nil, err
	}
	gpus, remap := plan.GPUs, plan.Remap
	plan.LogMoves(e.Logger())
	if plan.PluginDir != "" {
		if plan.PluginMemory && !target.CRIUPlugins() || plan.PluginFiles && !target.FilePlugins() {
			return nil, fmt.Errorf("the image holds GPU state or device files that a CRIU plugin restores: restoring it into %s is not supported yet", target.What())
		}
		r.PluginDir, r.Env = plan.PluginDir, append(slices.Clip(r.Env), plan.Env...)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("restore interrupted: %w", err)
	}

	if err := op.Update(func(rec *txn.Record) { rec.Remap = remap }); err != nil {
		return nil, err
	}
	if len(gpus) > 0 {
		defer e.TuneHost(op)() // CRIU refills the staged GPU memory, then the driver copies it back
	}
	tmp, err := TempDir()
	if err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp(tmp, "gpucr-restore-*")
	if err != nil {
		return nil, fmt.Errorf("create restore work dir: %w", err)
	}
	// CRIU's log is kept only while the error that names it is built. A CRIU killed midway
	// leaves what it mounted there (its cgroup yard): unmounted first, or the directory and
	// its mounts would outlive the restore.
	defer func() {
		if err := removeAll(work); err != nil {
			e.Logger().Warn("restore work directory left", "dir", work, "err", err)
		}
	}()
	if err := op.Update(func(rec *txn.Record) { rec.Paths = append(rec.Paths, work) }); err != nil {
		return nil, err
	}
	opts := r.Options
	opts.Flags = m.Options.ForRestore(r.Flags)
	// The large runs of memory are gpucr's to restore, on all cores: those it saved itself
	// at checkpoint always, and those in CRIU's files unless told otherwise or the image
	// holds state a CRIU plugin restores (the plugin may restore memory of its own).
	var split []int
	switch {
	case r.CRIURestoresPages || plan.PluginMemory:
	case !r.Streamed.splitFits(m, work):
		e.Logger().Info("CRIU restores the memory in its files itself: splitting them would copy them beyond the streamed restore's local disk bound, or the room its file system keeps")
	default:
		split = m.Leaves()
	}
	fill, err := e.planFill(root, r.Streamed.memory(r.Dir, filled), work, m, split)
	if err != nil {
		return nil, verify.prefer(err)
	}
	var whole atomic.Bool // the tasks passed the gate, and CRIU may have let them go
	spec := RestoreSpec{
		RestoreRequest: criu.RestoreRequest{ImagesDir: image.CRIUPath(root), WorkDir: work, Options: opts},
		Checked:        image.CRIUPath(root),
		Reopened:       m.Reopened,
		Timer:          t,
		Verified:       verify.wait,
		Procs:          func() ([]txn.Proc, []txn.GPUProc) { return imageProcs(m, gpus) },
		Created: func(made map[int]int) error {
			return op.Update(func(rec *txn.Record) {
				rec.Tree, rec.GPUs = imageProcs(m, gpus)
				journalMade(rec, made)
			})
		},
		Whole: func() error {
			if err := op.Update(func(rec *txn.Record) { rec.Committed = true }); err != nil {
				return err
			}
			whole.Store(true)
			return nil
		},
	}
	if fill.Dir != "" {
		spec.ImagesDir = fill.Dir
	}
	if fill.Bytes() > 0 {
		spec.Fill = fill
	}
	var restored *Restored
	err = t.Run(PhaseCRIURestore, func() (err error) {
		restored, err = target.Restore(ctx, op, spec)
		return err
	})
	if fill.Dir != "" {
		os.RemoveAll(fill.Dir) // the view of the image; CRIU's log stays in work
	}
	var cut cutOff
	if err != nil && whole.Load() && !errors.As(err, &cut) {
		// CRIU failed after the gate let the tasks go (its last answer lost, say): they may
		// run, their GPUs still checkpointed, and no journal would finish them. They go;
		// the image is unchanged (review).
		return nil, target.Remove(context.WithoutCancel(ctx), fmt.Errorf("CRIU failed after the restored processes were let go: %w", keepLog(err)))
	}
	if err != nil {
		// A damaged image explains any failure; nothing CRIU made runs on (the target
		// removed it). CRIU's log is kept only where the error that names it is the one
		// returned.
		if first := r.Streamed.prefer(verify.prefer(nil)); first != nil {
			return nil, first
		}
		return nil, explainRestoreFailure(keepLog(err)) // the kept log's path in the message
	}
	if restored.Filled > 0 {
		t.Phases = append(t.Phases, image.Phase{Name: PhaseMemoryFill, Duration: restored.Filled})
	}
	t.Phases = append(t.Phases, image.Phase{Name: PhaseVerify, Duration: verify.took})

	if len(gpus) > 0 {
		// Restore must not be abandoned halfway, even on Ctrl-C: finish, then report.
		gctx := context.WithoutCancel(ctx)
		err := func() error {
			if restored.FS != "" {
				// Onto the GPUs the restored processes were given, as the runc
				// integration's restore plans: a container with no GPU device had its
				// state restored onto the host's.
				plan, err := PlanGPUs(gctx, e.Backends, e.Off, m.GPUs, gpu.RestoreInput{CRIUDir: image.CRIUPath(root), GPUMap: r.GPUMap, Skips: r.Skips, Root: restored.FS})
				if err != nil {
					return err
				}
				if !reflect.DeepEqual(plan.Remap, remap) {
					plan.LogMoves(e.Logger())
				}
				gpus, remap = plan.GPUs, plan.Remap
				if err := op.Update(func(rec *txn.Record) { rec.Remap = remap }); err != nil {
					return err
				}
			}
			host, err := gpus.Renumber(restored.Host)
			if err != nil {
				return err
			}
			return t.Run(PhaseGPURestore, func() error { return host.Resume(gctx, remap) })
		}()
		if err != nil {
			return nil, target.Remove(gctx, fmt.Errorf("%w: %v", ErrGPURestore, err))
		}
	}
	return &RestoreResult{RootPID: restored.Root, SignedBy: signer, Manifest: m, GPUMap: remap, Phases: t.Phases, CRIUStats: restored.Stats}, nil
}

// journalMade records which of the image's processes in rec the restore made (made maps
// their image PIDs to host PIDs), under their host PIDs and start times. The others keep
// start 0: nothing shows that a process at such a PID is the restore's, and no rollback
// from the journal kills it.
func journalMade(rec *txn.Record, made map[int]int) {
	mark := func(p *txn.Proc) {
		h, ok := made[p.PID]
		p.Start = 0
		if !ok {
			return
		}
		p.PID = h
		if q, err := proctree.Read(h); err == nil {
			p.Start = q.Start
		}
	}
	for i := range rec.Tree {
		mark(&rec.Tree[i])
	}
	for i := range rec.GPUs {
		mark(&rec.GPUs[i].Proc)
	}
}

// planFill is memfill.Prepare, falling back to leaving CRIU's files whole when splitting
// them fails: that only wins speed (a full /tmp fails it, say).
func (e *Engine) planFill(imageDir string, mem memfill.Source, work string, m *image.Manifest, split []int) (*memfill.Plan, error) {
	fill, err := memfill.Prepare(imageDir, mem, work, m, split)
	if err != nil && split != nil && !errors.Is(err, image.ErrCorrupt) {
		e.Logger().Warn("CRIU restores the memory in its files itself", "err", err)
		fill, err = memfill.Prepare(imageDir, mem, work, m, nil)
	}
	return fill, err
}

// verification checks an image's files in the background during a restore.
type verification struct {
	done chan struct{}
	err  error
	took time.Duration
}

// startVerify starts checking the checksums of files: those a restore pins in root, the
// memory gpucr saved in dir. Its time, added to before (the checks already made), overlaps
// CRIU's restore, so it is recorded but not shown as a phase of its own while it runs.
func startVerify(root, dir string, files []image.File, before time.Duration) *verification {
	v := &verification{done: make(chan struct{})}
	go func() {
		defer close(v.done)
		start := time.Now()
		pinned, mem := image.SplitPinned(files)
		if v.err = image.CheckSums(root, pinned); v.err == nil {
			v.err = image.CheckSums(dir, mem)
		}
		v.took = before + time.Since(start)
	}()
	return v
}

// pin returns the image root a restore of dir reads, checks and hands to CRIU: dir itself
// when only root can change what CRIU reads there, else a private copy of those files
// (image.Pin) in a journaled staging directory, which a killed gpucr's recovery removes.
func (e *Engine) pin(dir string, files []image.File) (string, *StagingDir, error) {
	safe, err := image.OnlyRootCanChange(dir, files)
	if err != nil || safe {
		return dir, nil, err
	}
	private, err := NewStagingDir(e.JournalRoot, "private copy of the image "+dir, "gpucr-image-")
	if err != nil {
		return "", nil, err
	}
	e.Logger().Info("others may write in the image's directory: CRIU's files are copied to a private directory, checked and restored from there", "dir", dir, "copy", private.Dir)
	if err := image.Pin(dir, private.Dir, files); err != nil {
		var ce *image.CorruptError
		if !errors.As(err, &ce) {
			err = fmt.Errorf("%w (the copy is made because others may write in the image's directory: "+
				"make it and its parents writable by root only, or give $TMPDIR room)", err)
		}
		return "", nil, errors.Join(err, private.Close())
	}
	return private.Dir, private, nil
}

// splitMemory separates the files of raw memory — CRIU's page files, which CRIU copies
// without parsing them, and the ranges gpucr saved itself, which only the memory fill reads,
// behind the verification gate — from the files CRIU parses.
func splitMemory(files []image.File) (meta, memory []image.File) {
	for _, f := range files {
		if criuimg.IsPagesName(path.Base(f.Path)) || path.Dir(f.Path) == criuimg.MemDir {
			memory = append(memory, f)
		} else {
			meta = append(meta, f)
		}
	}
	return meta, memory
}

// splitFilled takes out of memory the files the fill reads whole and verifies as it reads
// them (memfill.CheckedDir): the memory gpucr saved itself. An empty one has nothing to
// read, and is left to the verification of the rest.
func splitFilled(memory []image.File) (filled, rest []image.File) {
	for _, f := range memory {
		if path.Dir(f.Path) == criuimg.MemDir && f.Size > 0 {
			filled = append(filled, f)
		} else {
			rest = append(rest, f)
		}
	}
	return filled, rest
}

func (v *verification) wait() error {
	<-v.done
	return v.err
}

// prefer returns the verification's error if the image is damaged, else err: a damaged
// image is the cause of whatever failed after reading it.
func (v *verification) prefer(err error) error {
	if verr := v.wait(); verr != nil {
		return verr
	}
	return err
}

// imageProcs journals a restore's processes: the image's PIDs (their start times come
// once CRIU has created them) and its GPU processes.
func imageProcs(m *image.Manifest, gpus GPUSet) ([]txn.Proc, []txn.GPUProc) {
	tree := make([]txn.Proc, 0, len(m.Processes))
	for _, p := range m.Processes {
		tree = append(tree, txn.Proc{PID: p.PID})
	}
	var held []txn.GPUProc
	for _, g := range gpus {
		held = append(held, txn.GPUProc{Backend: g.Backend.Name(), Proc: txn.Proc{PID: g.PID}})
	}
	return tree, held
}

// explainRestoreFailure adds what to do to CRIU failures users meet on the same host.
func explainRestoreFailure(err error) error {
	var ce *criu.Error
	if errors.As(err, &ce) && len(ce.Lines) > 0 && strings.Contains(ce.Lines[0], "Address already in use") {
		return fmt.Errorf("%w; a TCP port of the image is taken: if the original process just exited, "+
			"its connections stay in TIME_WAIT for up to 60 s, retry then", err)
	}
	if errors.As(err, &ce) && len(ce.Lines) > 0 && strings.Contains(ce.Lines[0], "Don't have tty to inherit") {
		return fmt.Errorf("%w; the job had a terminal: restore it from a terminal, which it is given", err)
	}
	return err
}

// RestorePlan is how an image's device state comes back on this host.
type RestorePlan struct {
	GPUs  GPUSet                       // processes a Checkpointer restores, at their image PIDs
	Remap map[string]map[string]string // backend -> image device -> host device; nil: none move
	// PluginDir is where CRIU loads the plugins that restore the rest ("" for none), and
	// Env their settings.
	PluginDir string
	Env       []string
	// PluginMemory says a plugin restores device state within CRIU's restore, and may
	// restore memory of its own: CRIU then restores every page itself.
	PluginMemory bool
	// PluginFiles says a plugin opens again device files held without device state (a
	// gpu.FileCarrier's).
	PluginFiles bool
}

// usePluginDir makes dir the plan's plugin directory, CRIU loading plugins from one only.
func (p *RestorePlan) usePluginDir(dir string) error {
	if p.PluginDir != "" && p.PluginDir != dir {
		return fmt.Errorf("the image needs CRIU plugins from two directories (%s, %s): CRIU loads plugins from one", p.PluginDir, dir)
	}
	p.PluginDir = dir
	return nil
}

// LogMoves logs each image device that goes to another host device, in a stable order.
func (p *RestorePlan) LogMoves(log *slog.Logger) {
	for _, b := range slices.Sorted(maps.Keys(p.Remap)) {
		for _, old := range slices.Sorted(maps.Keys(p.Remap[b])) {
			log.Info("GPU moved", "backend", b, "image", old, "host", p.Remap[b][old])
		}
	}
}

// PlanGPUs asks every backend to plan the restore of its state in an image (snaps, the
// image's GPU snapshots; where says where its CRIU files are, the user's --gpu-map, the
// checks switched off and the restored processes' root): that this host's devices can
// take it, and which host device each image device goes to.
// State of a vendor whose backend is off here (off, or not built in) is refused.
func PlanGPUs(ctx context.Context, backends []gpu.Backend, off []gpu.Off, snaps []gpu.Snapshot, where gpu.RestoreInput) (*RestorePlan, error) {
	for _, snap := range snaps {
		if gpu.Named(backends, snap.Backend) == nil {
			why := "it is not built into this gpucr"
			if i := slices.IndexFunc(off, func(o gpu.Off) bool { return o.Name == snap.Backend }); i >= 0 {
				why = off[i].Reason.Error()
			}
			what := snap.Backend + " GPU state"
			if len(snap.Processes) == 0 && len(snap.FileHolders) > 0 {
				what = "processes holding " + snap.Backend + " device files without GPU state (children forked after the GPU was in use)"
			}
			return nil, fmt.Errorf("%w: the image holds %s, and the %s backend is off on this host: %s (see gpucr check)",
				ErrNoBackend, what, snap.Backend, why)
		}
	}
	for _, o := range off {
		for _, pattern := range o.ImageFiles {
			if held, _ := filepath.Glob(filepath.Join(where.CRIUDir, pattern)); len(held) > 0 {
				return nil, fmt.Errorf("%w: the image holds %s GPU state (%s), and the %s backend is off on this host: %v (see gpucr check)",
					ErrNoBackend, o.Name, filepath.Base(held[0]), o.Name, o.Reason)
			}
		}
	}
	plan := &RestorePlan{}
	for _, b := range backends {
		in := where
		in.Snapshot = nil
		if i := slices.IndexFunc(snaps, func(s gpu.Snapshot) bool { return s.Backend == b.Name() }); i >= 0 {
			in.Snapshot = &snaps[i]
		}
		p, err := b.PlanRestore(ctx, in)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", b.Name(), err)
		}
		if p == nil {
			continue
		}
		if len(p.Remap) > 0 {
			if plan.Remap == nil {
				plan.Remap = map[string]map[string]string{}
			}
			plan.Remap[b.Name()] = p.Remap
		}
		plan.Env = append(plan.Env, p.Env...)
		if p.PluginDir != "" {
			if err := plan.usePluginDir(p.PluginDir); err != nil {
				return nil, err
			}
			plan.PluginFiles = true
		}
		switch b := b.(type) {
		case gpu.Checkpointer:
			if in.Snapshot != nil {
				for _, proc := range in.Snapshot.Processes {
					plan.GPUs = append(plan.GPUs, GPUProc{Backend: b, Process: proc})
				}
			}
		case gpu.CRIUPlugin:
			if err := plan.usePluginDir(b.PluginDir()); err != nil {
				return nil, err
			}
			plan.PluginMemory = true
		}
	}
	return plan, nil
}

// CanRestoreHere says why this gpucr cannot restore anything that would outlive it: it is
// not root, it is its PID namespace's first process (ErrNamespaceInit), or /proc is not its
// PID namespace's (ErrForeignProc). Asked before anything is fetched or changed.
func CanRestoreHere() error {
	if os.Geteuid() != 0 {
		return ErrNotRoot
	}
	if os.Getpid() == 1 {
		return ErrNamespaceInit
	}
	return ownProc()
}

// ownProc fails with ErrForeignProc where /proc is another PID namespace's: /proc/self
// names this process by its PID in the namespace /proc was mounted for. A checkpoint there
// read every PID in the wrong namespace and said the target was PID 1 of a namespace of
// its own (review).
func ownProc() error {
	if self, err := os.Readlink("/proc/self"); err == nil && self != strconv.Itoa(os.Getpid()) {
		return ErrForeignProc
	}
	return nil
}

// StartedByNamespaceInit returns the command of its PID namespace's first process when that
// process is this gpucr's parent (it started it, or took it over) in a namespace other than
// the host's (unshare --pid --fork sh -c 'gpucr restore ...'): what gpucr restores lives in
// that namespace and dies when that process exits, whose lifetime gpucr cannot know; a
// restore there reported success and the job was gone once the shell ended (review). Empty
// otherwise.
func StartedByNamespaceInit() string {
	if os.Getppid() != 1 || !inChildPIDNamespace() {
		return ""
	}
	comm, err := os.ReadFile("/proc/1/comm")
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(comm))
}

// inChildPIDNamespace says whether this process's PID namespace is not the host's, whose
// inode number the kernel fixes (PROC_PID_INIT_INO). A /proc mounted for the namespace
// shows no PID from above it (NSpid), so that cannot tell.
func inChildPIDNamespace() bool {
	ns, err := os.Readlink("/proc/self/ns/pid")
	return err == nil && ns != initialPIDNamespace
}

// initialPIDNamespace is the host's PID namespace as /proc/self/ns/pid names it.
const initialPIDNamespace = "pid:[4026531836]"

// pidWait bounds how long a restore waits for the image's PIDs to be let go by processes
// that are on their way out: a checkpointed tree's exited children, reparented to an init
// that reaps slowly, hold their PIDs and their session and group IDs until reaped.
const pidWait = 10 * time.Second

// waitPIDsFree fails up front when a PID or thread ID (tids: thread to its process) of the
// image is taken: CRIU restores the original IDs, and would otherwise fail halfway. IDs
// held by exited processes are waited for, at most limit; a live holder is named at once.
func waitPIDsFree(m *image.Manifest, tids map[int]int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		taken, err := pidsTaken(m, tids)
		if err != nil || taken == nil {
			return err
		}
		dying := taken.holder.Zombie || taken.as != "" // a group or session outlives its leader briefly
		if !dying || time.Now().After(deadline) {
			return taken.err()
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// freePID is what to do about a taken PID. CRIU gives a tree in the node's own PID
// namespace its PIDs back, so only freeing them helps; restoring from a fresh namespace
// (the advice this replaced) reports success and loses the tree (ErrNamespaceInit).
const freePID = "stop it: the image's processes get their PIDs back (a job started as the first process of a " +
	"PID namespace of its own restores beside its original: docs/moving-hosts.md)"

// pidTaken is an image PID in use, and the process that uses it.
type pidTaken struct {
	img    image.Process
	holder proctree.Process
	as     string // "", "process group", "session"
	tid    int    // a thread of img's whose ID is the holder's, or one of its threads'
}

func (t *pidTaken) err() error {
	held := fmt.Sprintf("%q (PID %d)", t.holder.Command, t.holder.PID)
	if t.holder.Zombie {
		held = fmt.Sprintf("an exited %q (PID %d) that its parent %d has not reaped", t.holder.Command, t.holder.PID, t.holder.PPID)
	}
	what := "is held by"
	if t.as != "" {
		what = "is the " + t.as + " ID of"
	}
	if t.tid != 0 {
		return fmt.Errorf("%w: thread %d of PID %d (%s in the image) is held by %s; %s",
			ErrPIDInUse, t.tid, t.img.PID, t.img.Command, held, freePID)
	}
	return fmt.Errorf("%w: PID %d (%s in the image) %s %s; %s",
		ErrPIDInUse, t.img.PID, t.img.Command, what, held, freePID)
}

// pidsTaken finds the first image PID that a process, or a process group or session, uses,
// or else the first of the image's thread IDs (tids) that a process or thread here has.
func pidsTaken(m *image.Manifest, tids map[int]int) (*pidTaken, error) {
	all, err := proctree.All()
	if err != nil {
		return nil, err
	}
	want := map[int]image.Process{}
	for _, p := range m.Processes {
		want[p.PID] = p
	}
	for _, q := range all {
		if p, ok := want[q.PID]; ok {
			return &pidTaken{img: p, holder: q}, nil
		}
	}
	for _, q := range all {
		if p, ok := want[q.Pgrp]; ok {
			return &pidTaken{img: p, holder: q, as: "process group"}, nil
		}
		if p, ok := want[q.Session]; ok {
			return &pidTaken{img: p, holder: q, as: "session"}, nil
		}
	}
	for _, tid := range slices.Sorted(maps.Keys(tids)) {
		// /proc lists processes only, but opens any thread's ID: its Tgid is its process.
		tgid, err := proctree.ThreadGroup(tid)
		if errors.Is(err, proctree.ErrNoProcess) {
			continue
		}
		if err != nil {
			return nil, err
		}
		holder, err := proctree.Read(tgid)
		if err != nil {
			continue // gone since
		}
		return &pidTaken{img: want[tids[tid]], holder: holder, tid: tid}, nil
	}
	return nil, nil
}

// filesPresent checks, before CRIU starts, that no named socket of the image would be bound
// through a symlink, and that the files the image's processes had open or mapped exist
// here: on another host CRIU would otherwise fail halfway, naming one file and not who used
// it.
func filesPresent(criuDir string, m *image.Manifest) error {
	if err := criuimg.CheckSocketDirs(criuDir); err != nil {
		return err
	}
	missing, err := criuimg.MissingFiles(criuDir)
	if err != nil {
		return fmt.Errorf("check the image's files: %w", err)
	}
	switch len(missing) {
	case 0:
		return nil
	case 1:
		return fmt.Errorf("%w: %s, %s; provide it at that path, or restore where it exists", ErrNoFile, missing[0].Path, usedBy(missing[0], m))
	}
	more := make([]string, 0, 3)
	for _, f := range missing[1:min(len(missing), 4)] {
		more = append(more, f.Path)
	}
	return fmt.Errorf("%w: %s, %s, and %d more (%s); provide them at those paths, or restore where they exist",
		ErrNoFile, missing[0].Path, usedBy(missing[0], m), len(missing)-1, strings.Join(more, ", "))
}

// usedBy says which process of the image used a missing file, and how.
func usedBy(f criuimg.MissingFile, m *image.Manifest) string {
	if f.PID == 0 {
		return "a working or root directory of the image's processes"
	}
	who := fmt.Sprintf("PID %d", f.PID)
	if i := slices.IndexFunc(m.Processes, func(p image.Process) bool { return p.PID == f.PID }); i >= 0 {
		who = fmt.Sprintf("PID %d (%s)", f.PID, m.Processes[i].Command)
	}
	if f.FD < 0 {
		return "mapped by " + who
	}
	return fmt.Sprintf("open in %s as fd %d", who, f.FD)
}

// selfStart is gpucr's own start time, in proctree's units: whatever a restore created
// started no earlier.
func selfStart() uint64 {
	p, err := proctree.Read(os.Getpid())
	if err != nil {
		return 0 // unreadable /proc/self: judged by the binary alone
	}
	return p.Start
}

// How long CRIU may take to resume a restore's tasks once they are whole, and how much
// longer an interrupt then waits for it, before CRIU and the tasks are killed: resuming
// takes milliseconds, and only a hung CRIU (or a hung action script of the user's) runs out.
const (
	resumeLimit    = 60 * time.Second
	resumeLimitCut = 10 * time.Second
)

// cutoff decides when a restore running under CRIU is abandoned: at once when ctx is
// cancelled before the tasks are journaled whole; after that only if CRIU does not finish
// in time, since a whole restore is finished rather than thrown away. Abandoning cancels
// the context CRIU runs under, which kills CRIU.
type cutoff struct {
	mu     sync.Mutex
	whole  bool
	reason error // why the restore was abandoned; nil while it was not
	cancel context.CancelFunc
	timer  *time.Timer
	unhook func() bool // stops listening to the caller's context
}

// newCutoff wraps s.Whole and returns the context to run CRIU under.
func newCutoff(ctx context.Context, s *RestoreSpec) (*cutoff, context.Context) {
	run, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c := &cutoff{cancel: cancel}
	c.unhook = context.AfterFunc(ctx, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if !c.whole {
			c.abandon(cutOff("restore interrupted"))
		} else if c.timer.Stop() {
			c.timer = time.AfterFunc(resumeLimitCut, func() {
				c.expire(fmt.Sprintf("restore interrupted, and CRIU did not resume the restored tasks within %v", resumeLimitCut))
			})
		}
	})
	journal := s.Whole
	s.Whole = func() error {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.reason != nil {
			return c.reason
		}
		if err := journal(); err != nil {
			return err
		}
		c.whole = true
		c.timer = time.AfterFunc(resumeLimit, func() {
			c.expire(fmt.Sprintf("CRIU did not resume the restored tasks within %v", resumeLimit))
		})
		return nil
	}
	return c, run
}

func (c *cutoff) expire(reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.abandon(cutOff(reason))
}

// cutOff is why a cutoff abandoned a restore: the target has killed what CRIU made.
type cutOff string

func (c cutOff) Error() string { return string(c) }

func (c *cutoff) abandon(reason error) {
	if c.reason == nil {
		c.reason = reason
		c.cancel()
	}
}

// done stops the clock and says why the restore was abandoned, or nil.
func (c *cutoff) done() error {
	c.unhook()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timer != nil {
		c.timer.Stop()
	}
	return c.reason
}
