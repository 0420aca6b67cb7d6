package engine

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/crit"

	"github.com/gpucr/gpucr/internal/crashpoint"
	"github.com/gpucr/gpucr/internal/criu"
	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/memfill"
	"github.com/gpucr/gpucr/internal/pageserver"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/safety"
	"github.com/gpucr/gpucr/internal/store/chunked"
	"github.com/gpucr/gpucr/internal/txn"
)

// CheckpointRequest is where and how to checkpoint a target.
type CheckpointRequest struct {
	Dir          string
	LeaveRunning bool
	LockTimeout  time.Duration // how long a GPU lock waits for work in flight
	// Stream, when set, takes the memory pages from CRIU through gpucr's page server and
	// stores them as they come; Dir then only stages CRIU's other files, and the image is
	// committed to the store instead of at Dir, which is left absent.
	Stream *chunked.Stream
	// Scratch are paths the caller created for this checkpoint alone (a stream's staging),
	// removed by the rollback if gpucr dies.
	Scratch []string
	// CRIUWritesPages lets CRIU write the page files itself instead of sending them to
	// gpucr's page server: slower, kept to compare the two (checkpoint --criu-writes-pages).
	CRIUWritesPages bool
	// CRIUCompatible keeps every page in CRIU's own files, none in gpucr's mem/, so that
	// plain `criu restore` restores the CPU side (checkpoint --criu-compatible).
	CRIUCompatible bool
	// Sign, when set, signs the image's manifest (gpucr checkpoint --sign).
	Sign ed25519.PrivateKey
	// SkipChecks switches off restorability checks by name (--skip-check).
	SkipChecks safety.Skips
	criu.Options
}

// Checkpoint writes an image of target to r.Dir (or r.Stream). Every target — a process
// tree, a container — goes through this one sequence: GPUs locked and checkpointed, the
// tree frozen and dumped, the memory saved, the image committed while the tree is still
// frozen, and only then the tree released (killed, or resumed with r.LeaveRunning). Each
// change is journaled before it is made and pushed on one undo stack: on any failure the
// tree keeps running with its GPUs unlocked, and nothing appears at r.Dir.
func (e *Engine) Checkpoint(ctx context.Context, target Target, r CheckpointRequest) (res *Checkpointed, err error) {
	if os.Geteuid() != 0 {
		return nil, ErrNotRoot
	}
	if err := ownProc(); err != nil {
		return nil, err
	}
	tree, err := target.Open(ctx)
	if err != nil {
		return nil, err
	}
	if len(tree) > image.MaxProcesses {
		// Its image would be refused by every restore.
		return nil, fmt.Errorf("%w: %s has %d processes, more than the %d an image may hold", ErrBadTarget, target.What(), len(tree), image.MaxProcesses)
	}
	op, err := e.Begin(txn.OpCheckpoint, target.What(), target.Locks()...)
	if err != nil {
		return nil, err
	}
	defer op.End()
	snap := proctree.Snap("/proc", tree)
	found, err := Inspect(ctx, e.Backends, e.Off, snap, skipsFor(target, r))
	if err != nil {
		return nil, err
	}
	gpus, snaps := found.GPUs, found.Snapshots
	if len(found.Frozen) > 0 {
		return nil, found.Frozen[0]
	}
	if err := found.refuseUnloadable(target, snap); err != nil {
		return nil, err
	}
	if len(found.Plugins) > 0 || len(found.Carriers) > 0 {
		// The plugins save device state, or carry device files, within CRIU's dump.
		if r.PluginDir, err = found.PluginDir(); err != nil {
			return nil, err
		}
	}
	var undo Undo
	defer func() { err = undo.Unwind(ctx, err) }()
	stage, err := e.BeginStaging(op, r.Dir, r.Scratch, tree, gpus)
	if err != nil {
		return nil, err
	}
	stage.SignWith = r.Sign
	undo.Always("remove the staged image", func(context.Context) error { return stage.Abort() })
	if r.Stream != nil {
		undo.Always("abort the stream", func(context.Context) error { r.Stream.Abort(); return nil })
		if err := op.Update(func(rec *txn.Record) { rec.Stored = r.Stream.URL() }); err != nil {
			return nil, err
		}
	}
	t := e.NewTimer(op)
	// gpucr saves the large runs of memory itself (below) unless CRIU is to write them all,
	// or a plugin saves device state within CRIU's dump (one carrying device files saves none).
	selfSave := !r.CRIUWritesPages && !r.CRIUCompatible && len(found.Plugins) == 0
	var reserve *memfill.Reserve
	if selfSave && r.Stream == nil && len(gpus) > 0 {
		// While the driver stages device memory, the memory its image will take is allocated.
		reserve = memfill.ReserveFor(stage.Dir(), int64(gpuMemory(snaps)))
		undo.Always("remove the memory reserved for the save", func(context.Context) error { return reserve.Release() })
	}
	pauseStart := time.Now() // the workload stops with its GPUs' lock (or CRIU's freeze)
	var gpuResume *GPUResume
	if len(gpus) > 0 {
		restoreTHP := e.TuneHost(op) // the driver stages device memory into huge pages
		undo.Always("put transparent huge pages back", func(context.Context) error { restoreTHP(); return nil })
		if gpuResume, err = CheckpointGPUs(ctx, t, gpus, r.LockTimeout, &undo); err != nil {
			return nil, err
		}
	}
	frozen, err := target.Freeze(ctx, op, &undo)
	if err != nil {
		return nil, err
	}
	if frozen != nil {
		tree = frozen // the image describes what is dumped: a short-lived child may be gone
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("checkpoint interrupted: %w", err)
	}
	ids, err := imagePIDs(target, tree)
	if err != nil {
		return nil, err
	}
	m := newManifest(e, tree, ids, snaps, r)

	// The large runs of the processes' memory (a GPU process's staged device memory) are
	// gpucr's to save, on all cores, once CRIU has frozen the tree; CRIU leaves them out.
	var saved []memfill.Range
	if selfSave {
		if saved, err = memfill.Select(tree); err != nil {
			return nil, err
		}
		for i := range saved {
			saved[i].ImagePID = ids[saved[i].PID]
		}
		if len(saved) > 0 {
			// Absolute: CRIU works in a directory of its own, where a relative -D named
			// nothing, and it dumped all the memory gpucr saves too (hostile test).
			ranges, err := filepath.Abs(filepath.Join(stage.LogsDir(), "gpucr-skip-ranges"))
			if err != nil {
				return nil, err
			}
			if err := memfill.WriteRanges(ranges, saved); err != nil {
				return nil, err
			}
			r.Env = append(slices.Clip(r.Env), memfill.SkipEnv+"="+ranges)
		}
	}
	dump := criu.DumpRequest{
		ImagesDir: stage.CRIUDir(), WorkDir: stage.LogsDir(),
		LeaveRunning: r.LeaveRunning, LinkRemap: len(found.Semaphores) > 0, Options: r.Options,
	}
	var pages *pageserver.Server
	if !r.CRIUWritesPages || r.Stream != nil {
		// CRIU sends the pages to gpucr, which writes (or stores) and checksums them on all
		// cores while CRIU's one thread keeps sending.
		var sink pageserver.Sink = stagingSink{stage}
		if r.Stream != nil {
			sink = storeSink{r.Stream}
		}
		if pages, err = pageserver.Start(stage.CRIUDir(), sink); err != nil {
			return nil, err
		}
		undo.Always("stop the page server", func(context.Context) error { pages.Close(); return nil })
		dump.PageServerPort = pages.Port()
	}

	// The image is committed while the tree is still frozen: if the commit fails, the tree
	// is resumed instead of killed, so nothing is lost. A tree left running (a periodic
	// checkpoint) runs again once its state is copied: its image is made durable and
	// committed behind it, and counts only once committed.
	early := r.LeaveRunning && r.Stream == nil
	var copied []image.File // early: the memory saved, still to be made durable
	if len(saved) == 0 {
		if err := reserve.Release(); err != nil { // no save takes it: nothing of it may be committed
			return nil, err
		}
	}
	save := e.newMemorySave(ctx, stage, saved, r.Stream, reserve)
	undo.Always("stop the memory save", func(context.Context) error { save.stop(); return nil })
	dumpStart := time.Now()
	op.Phase(PhaseCRIUDump)
	e.reporter().Start(PhaseCRIUDump)
	crashpoint.Hit("start " + PhaseCRIUDump)
	dumped, commitErr := false, error(nil)
	commit := func() error {
		d := time.Since(dumpStart)
		dumped = true
		t.Phases = append(t.Phases, image.Phase{Name: PhaseCRIUDump, Duration: d})
		e.reporter().Done(PhaseCRIUDump, d)
		crashpoint.Hit("end " + PhaseCRIUDump)
		// A periodic timerfd that expired unread while the tree was frozen would restore
		// disarmed (criuimg.RearmExpiredTimerfds); the image is sealed only after this.
		if _, commitErr = criuimg.RearmExpiredTimerfds(stage.CRIUDir()); commitErr != nil {
			return commitErr
		}
		if m.Reopened, commitErr = reopenedFiles(stage.CRIUDir(), hostPIDs(ids)); commitErr != nil {
			return commitErr
		}
		if len(found.Semaphores) > 0 {
			if m.LinkedFiles, commitErr = linkedFiles(stage.CRIUDir(), proctree.Snap("/proc", tree)); commitErr != nil {
				return commitErr
			}
		}
		if early {
			copied, commitErr = saveFrozen(ctx, t, target, stage, pages, save)
		} else {
			commitErr = e.commitFrozen(ctx, op, t, target, stage, m, pages, save, r.Stream)
		}
		return commitErr
	}
	if err := target.Dump(ctx, dump, DumpHooks{Frozen: save.start, Commit: commit}); err != nil {
		if !dumped {
			e.reporter().Done(PhaseCRIUDump, time.Since(dumpStart))
		}
		switch {
		case commitErr != nil:
			return nil, commitErr
		case r.Stream != nil && r.Stream.Err() != nil:
			// The store failed first; CRIU only saw its page server hang up.
			return nil, fmt.Errorf("store memory pages: %w", r.Stream.Err())
		case pages != nil && pages.Err() != nil:
			// gpucr's page server failed first (a full disk, say); CRIU saw it hang up.
			return nil, pages.Err()
		}
		if err := save.failed(); err != nil {
			return nil, err // the save beside the dump filled the disk CRIU writes to, say
		}
		if dumped && !early {
			// Committed, then CRIU failed (killed after its post-dump notification): the
			// image is whole, and a failure that said only "criu dump failed" had a script
			// remove the job's only copy (crash test). The rollback resumes what still runs.
			where := r.Dir
			var ce *criu.Error
			if r.Stream != nil {
				where = "the store"
				err = keepLog(err)
			} else if errors.As(err, &ce) {
				ce.LogPath = filepath.Join(r.Dir, image.LogsDir, filepath.Base(ce.LogPath)) // moved with the image
			}
			return &Checkpointed{Manifest: m}, fmt.Errorf("the image written to %s is complete, but CRIU failed after it was written (%w): "+
				"the workload may run on, or may have stopped; check it before you restore", where, err)
		}
		return nil, keepLog(err)
	}
	if early {
		return e.resumeAndCommit(ctx, op, t, &undo, target, stage, r.Dir, m, gpuResume, copied, pauseStart)
	}
	undo.Commit()
	if r.Stream == nil {
		// CRIU writes its statistics once the image is committed, with the umask's mode.
		if err := os.Chmod(filepath.Join(r.Dir, image.LogsDir, crit.StatsDump), 0o600); err != nil && !errors.Is(err, fs.ErrNotExist) {
			e.Logger().Warn("CRIU's statistics are readable by others", "err", err)
		}
	}

	// The image is safe: now the tree goes, or carries on.
	where := r.Dir
	if r.Stream != nil {
		where = "the store"
	}
	res = &Checkpointed{Manifest: m}
	if err := target.Release(context.WithoutCancel(ctx), r.LeaveRunning); err != nil {
		return res, fmt.Errorf("image written to %s, but %w%s", where, err, gpuResume.leftHint(r.LeaveRunning))
	}
	if r.LeaveRunning && gpuResume != nil {
		if err := t.Run(PhaseGPUResume, func() error { return gpuResume.Resume(context.WithoutCancel(ctx)) }); err != nil {
			return res, fmt.Errorf("image written to %s, but resuming the GPU processes failed: %w", where, err)
		}
	}
	res.Paused = time.Since(pauseStart)
	m.Phases = t.Phases
	return res, nil
}

// Checkpointed is a committed checkpoint: its manifest, and how long the workload was
// stopped (from its GPUs' lock, or CRIU's freeze, to running again; for a tree not left
// running, to its end).
type Checkpointed struct {
	*image.Manifest
	Paused time.Duration
}

// resumeAndCommit ends a checkpoint that leaves its tree running, once the tree's state is
// copied into the staged image: the tree and its GPUs run again while the copy is made
// durable and committed. If the commit fails the workload runs on and no image appears.
func (e *Engine) resumeAndCommit(ctx context.Context, op *Op, t *Timer, undo *Undo, target Target, stage *image.Staging, dir string,
	m *image.Manifest, gpuResume *GPUResume, copied []image.File, pauseStart time.Time) (*Checkpointed, error) {
	// From here a rollback has nothing to undo in the tree: it is released next, and a
	// gpucr that dies before the commit leaves an uncommitted checkpoint, which the
	// guardian rolls back by resuming the GPUs wherever they got to.
	undo.Commit()
	res := &Checkpointed{Manifest: m}
	resume := Timer{r: e.reporter()} // runs beside the commit, so it journals no phase
	resumed := make(chan error, 1)
	go func() {
		ctx := context.WithoutCancel(ctx)
		err := target.Release(ctx, true)
		if err != nil {
			err = fmt.Errorf("%w%s", err, gpuResume.leftHint(true))
		} else if gpuResume != nil {
			err = resume.Run(PhaseGPUResume, func() error { return gpuResume.Resume(ctx) })
		}
		res.Paused = time.Since(pauseStart)
		resumed <- err
	}()
	commitErr := e.commitDurable(ctx, op, t, stage, m, copied)
	resumeErr := <-resumed
	t.Phases = append(t.Phases, resume.Phases...)
	m.Phases = t.Phases
	switch {
	case commitErr != nil && resumeErr != nil:
		return nil, fmt.Errorf("%w; and resuming the workload failed: %v", commitErr, resumeErr)
	case commitErr != nil:
		return nil, fmt.Errorf("%w (the workload runs on)", commitErr)
	case resumeErr != nil:
		return res, fmt.Errorf("image written to %s, but resuming the workload failed: %w", dir, resumeErr)
	}
	return res, nil
}

// skipsFor is r's skipped checks, with those that do not apply to target or to r off:
// where a runtime gives the restored processes their standard descriptors again (a
// container's), their pipes to the runtime are no outer pipes, and the files it maps shared
// are in its own /dev/shm, a tmpfs of its mount namespace that CRIU saves whole; a file a
// process tree maps shared changes after its checkpoint only if the tree is left running;
// and an established TCP connection is CRIU's to checkpoint once --tcp-established says so.
func skipsFor(target Target, r CheckpointRequest) safety.Skips {
	out := maps.Clone(r.SkipChecks)
	if out == nil {
		out = safety.Skips{}
	}
	if target.RuntimeStdio() {
		out[safety.CheckOuterPipe] = true
		out[safety.CheckSharedFile] = true
	}
	if !r.LeaveRunning {
		out[safety.CheckSharedFile] = true
	}
	if r.TCPEstablished {
		out[safety.CheckTCP] = true
	}
	if target.CarriesSemaphores() {
		out[safety.CarrySemaphores] = true
	}
	return out
}

// Inspect finds the GPU processes of tree and refuses, before anything is locked, a tree
// whose checkpoint could not be restored or whose GPU processes a signal or a tracer has
// stopped: the workload is untouched either way. GPU processes frozen with their cgroup
// are in Found.Frozen.
func Inspect(ctx context.Context, backends []gpu.Backend, off []gpu.Off, tree *proctree.Snapshot, skips safety.Skips) (Found, error) {
	found, err := FindGPUProcs(ctx, backends, off, tree)
	if err != nil {
		return Found{}, err
	}
	if found.Semaphores, err = safety.Check(tree, found.GPUs.safetyView(), skips); err != nil {
		return Found{}, err
	}
	if err := refuseStopped(found.GPUs, tree); err != nil {
		return Found{}, err
	}
	if found.Frozen, err = frozenCgroups(found.GPUs); err != nil {
		return Found{}, err
	}
	return found, nil
}

// gpuMemory is the device memory of the processes in snaps: about what the driver stages.
func gpuMemory(snaps []gpu.Snapshot) uint64 {
	var n uint64
	for _, s := range snaps {
		for _, p := range s.Processes {
			n += p.MemoryBytes
		}
	}
	return n
}

// CheckpointGPUs locks gpus, waiting at most timeout for work in flight, and checkpoints
// their device state into host memory; their resume is on undo before the first lock, and
// returned for a tree left running.
func CheckpointGPUs(ctx context.Context, t *Timer, gpus GPUSet, timeout time.Duration, undo *Undo) (*GPUResume, error) {
	resume := &GPUResume{gpus: gpus}
	undo.OnFail("resume the GPU processes", resume.rollback)
	watched := warnWhileStopped(gpus, t.logger(), stoppedCheckEvery)
	err := t.Run(PhaseGPULock, func() error { return gpus.Lock(ctx, timeout) })
	watched()
	if err != nil {
		return nil, fmt.Errorf("lock GPU processes: %w", err)
	}
	if err := t.Run(PhaseGPUCheckpoint, func() error { return gpus.Checkpoint(ctx) }); err != nil {
		return nil, fmt.Errorf("checkpoint GPU state: %w", err)
	}
	return resume, nil
}

// GPUResume brings a checkpoint's GPU processes back to running, once: the rollback and
// the resume of a tree left running are one step, and a resume that failed after its
// retries is neither tried nor reported twice.
type GPUResume struct {
	gpus  GPUSet
	mu    sync.Mutex
	tried bool
	err   error
}

// Resume resumes the processes, retrying (GPUSet.ResumeRetrying), the first time it is
// called, and returns that call's error every time.
func (r *GPUResume) Resume(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.tried {
		r.tried, r.err = true, r.gpus.ResumeRetrying(ctx, nil, GPURetryWait)
	}
	return r.err
}

// leftHint says, for a tree to be left running that could not be let go (a container
// runc would not resume), that its GPU processes stay checkpointed, and what brings them
// back: the message said only that the container was left paused, and once resumed by
// hand the job hung on its GPUs (review). Empty for no GPUs, or a tree not left running.
func (r *GPUResume) leftHint(leaveRunning bool) string {
	if r == nil || !leaveRunning || len(r.gpus) == 0 {
		return ""
	}
	pids := make([]string, len(r.gpus))
	for i, p := range r.gpus {
		pids[i] = strconv.Itoa(p.PID)
	}
	return fmt.Sprintf("; its GPU processes stay checkpointed: once it runs again, `gpucr recover --pid %s` brings them back", strings.Join(pids, ","))
}

// rollback is Resume as an undo step: a resume already made has answered for itself.
func (r *GPUResume) rollback(ctx context.Context) error {
	r.mu.Lock()
	tried := r.tried
	r.mu.Unlock()
	if tried {
		return nil
	}
	return r.Resume(ctx)
}

// commitFrozen finishes a checkpoint whose tree has been dumped and is still frozen: the
// page server has received everything, the target's own files join the image, the memory
// gpucr saves itself is saved, and the image is committed and journaled as such.
func (e *Engine) commitFrozen(ctx context.Context, op *Op, t *Timer, target Target, stage *image.Staging, m *image.Manifest,
	pages *pageserver.Server, save *memorySave, s *chunked.Stream) error {
	if s != nil {
		if _, err := saveFrozen(ctx, t, target, stage, pages, save); err != nil {
			return err
		}
		err := t.Run(PhaseCommit, func() error {
			m.Phases = slices.Clone(t.Phases)
			return storeStreamed(ctx, stage, m, s)
		})
		if err != nil {
			return err
		}
		return op.Update(func(r *txn.Record) { r.Committed = true })
	}
	copied, err := saveFrozen(ctx, t, target, stage, pages, save)
	if err != nil {
		return err
	}
	return e.commitDurable(ctx, op, t, stage, m, copied)
}

// frozenFiles waits for the pages CRIU sent and adds the target's own files to the image.
func frozenFiles(ctx context.Context, target Target, stage *image.Staging, pages *pageserver.Server) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("checkpoint interrupted: %w", err)
	}
	if pages != nil {
		if _, err := pages.Wait(ctx); err != nil {
			return err
		}
	}
	return target.Describe(stage.Dir())
}

// saveFrozen has everything of a dumped, still frozen tree in the staged image (or its
// stream): the pages CRIU sent, the target's files and the memory gpucr saves itself,
// whose save may have started long before. Nothing is durable yet; the tree may run again
// once it returns.
func saveFrozen(ctx context.Context, t *Timer, target Target, stage *image.Staging,
	pages *pageserver.Server, save *memorySave) ([]image.File, error) {
	if err := frozenFiles(ctx, target, stage, pages); err != nil {
		return nil, err
	}
	return save.wait(t)
}

// commitDurable makes the staged image durable and commits it: the memory gpucr saved
// (copied) synced, every file checksummed into m, the manifest written and the directory
// renamed into place, then journaled as committed.
func (e *Engine) commitDurable(ctx context.Context, op *Op, t *Timer, stage *image.Staging, m *image.Manifest, copied []image.File) error {
	pages, err := PagesBytes(stage.CRIUDir())
	if err != nil {
		return err
	}
	m.MemoryBytes = pages
	for _, f := range copied {
		m.MemoryBytes += uint64(f.Size)
	}
	// The commit's own time cannot be in the manifest it checksums; the caller's copy has it.
	m.Phases = slices.Clone(t.Phases)
	err = t.Run(PhaseCommit, func() error {
		if err := memfill.Sync(ctx, stage.Dir(), copied); err != nil {
			return err
		}
		return stage.CommitWith(m, copied)
	})
	if err != nil {
		return err
	}
	return op.Update(func(r *txn.Record) { r.Committed = true })
}

// newManifest describes tree, numbered as ids says, and its GPU state for an image.
func newManifest(e *Engine, tree []proctree.Process, ids map[int]int, snaps []gpu.Snapshot, r CheckpointRequest) *image.Manifest {
	m := &image.Manifest{
		GpucrVersion: e.Version,
		CRIUVersion:  e.CRIU.VersionString(),
		Created:      time.Now().UTC(),
		Host:         HostInfo(),
		RootPID:      ids[tree[0].PID],
		Options:      image.Options{LeaveRunning: r.LeaveRunning, Flags: r.Flags},
		GPUs:         slices.Clone(snaps),
	}
	for _, p := range tree {
		ppid, ok := ids[p.PPID]
		if !ok && ids[p.PID] == p.PID {
			ppid = p.PPID // the tree is numbered as the host numbers it: so is its parent
		}
		m.Processes = append(m.Processes, image.Process{PID: ids[p.PID], PPID: ppid, Command: p.Command, Threads: p.Threads})
	}
	for s := range m.GPUs {
		m.GPUs[s].Processes = slices.Clone(m.GPUs[s].Processes)
		for i := range m.GPUs[s].Processes {
			m.GPUs[s].Processes[i].PID = ids[m.GPUs[s].Processes[i].PID]
		}
		// The processes holding device files are numbered as the image too: in a PID
		// namespace of the tree's own they kept their host PIDs, which named none of the
		// image's, and one equal to a GPU process's had the image refused (listed twice).
		m.GPUs[s].FileHolders = slices.Clone(m.GPUs[s].FileHolders)
		for i, pid := range m.GPUs[s].FileHolders {
			m.GPUs[s].FileHolders[i] = ids[pid]
		}
	}
	return m
}

// hostPIDs inverts imagePIDs: this host's PID of each of the image's processes.
func hostPIDs(ids map[int]int) map[int]int {
	out := make(map[int]int, len(ids))
	for host, id := range ids {
		out[id] = host
	}
	return out
}

// imagePIDs numbers each process of tree as the image will.
func imagePIDs(target Target, tree []proctree.Process) (map[int]int, error) {
	ids := make(map[int]int, len(tree))
	for _, p := range tree {
		id, err := target.ImagePID(p.PID)
		if err != nil {
			return nil, err
		}
		ids[p.PID] = id
	}
	return ids, nil
}

// BeginStaging journals what the checkpoint will change — the tree, its GPU processes, the
// staging directory and the caller's scratch — and only then creates the staging directory.
func (e *Engine) BeginStaging(op *Op, dir string, scratch []string, tree []proctree.Process, gpus GPUSet) (*image.Staging, error) {
	procs := make([]txn.Proc, 0, len(tree))
	for _, p := range tree {
		procs = append(procs, txn.Proc{PID: p.PID, Start: p.Start})
	}
	var held []txn.GPUProc
	for _, g := range gpus {
		i := slices.IndexFunc(tree, func(p proctree.Process) bool { return p.PID == g.PID })
		if i < 0 {
			return nil, fmt.Errorf("GPU process %d is not in the tree", g.PID)
		}
		held = append(held, txn.GPUProc{Backend: g.Backend.Name(), Proc: procs[i]})
	}
	staging := image.StagingPath(dir, op.ID())
	err := op.Update(func(r *txn.Record) {
		r.Tree, r.GPUs = procs, held
		r.Paths = append(append(r.Paths, scratch...), staging)
	})
	if err != nil {
		return nil, err
	}
	return image.BeginAt(dir, staging)
}

// storeStreamed finishes a streamed checkpoint: once every file streamed is stored, the
// manifest is sealed with them in it and stored with the staged files, last of all the
// manifest object that makes the checkpoint exist. m's memory counts the streamed files.
func storeStreamed(ctx context.Context, stage *image.Staging, m *image.Manifest, s *chunked.Stream) error {
	streamed, err := s.Files()
	if err != nil {
		return fmt.Errorf("store memory pages: %w", err)
	}
	for _, f := range streamed {
		m.MemoryBytes += uint64(f.Size)
	}
	if err := stage.Seal(m, streamed); err != nil {
		return err
	}
	_, _, err = s.Finish(ctx, stage.Dir(), m)
	return err
}

// stagingSink writes the page files into the staged image.
type stagingSink struct{ s *image.Staging }

func (k stagingSink) Create(name string) (criuimg.Receiver, error) {
	return receiver(k.s.CreatePages(name))
}

// StoreSink names the page files a streamed checkpoint receives as they sit in an image.
func StoreSink(s *chunked.Stream) pageserver.Sink { return storeSink{s} }

type storeSink struct{ s *chunked.Stream }

func (k storeSink) Create(name string) (criuimg.Receiver, error) {
	return receiver(k.s.Create(image.CRIUDir + "/" + name))
}

// receiver hands on a file that receives pages, or its error with no file at all: a typed
// nil pointer in the interface would look like a file to close.
func receiver[R criuimg.Receiver](r R, err error) (criuimg.Receiver, error) {
	if err != nil {
		return nil, err
	}
	return r, nil
}

// PagesBytes sums CRIU's page files: the memory the image holds.
func PagesBytes(dir string) (uint64, error) {
	matches, err := filepath.Glob(filepath.Join(dir, criuimg.PagesGlob))
	if err != nil {
		return 0, err
	}
	var total uint64
	for _, f := range matches {
		fi, err := os.Stat(f)
		if err != nil {
			return 0, fmt.Errorf("size of %s: %w", f, err)
		}
		total += uint64(fi.Size())
	}
	return total, nil
}

// keepLog copies a failed CRIU run's log out of the staging directory, which is about to
// be removed, so the error can point at it.
func keepLog(err error) error {
	var ce *criu.Error
	if !errors.As(err, &ce) {
		return err
	}
	b, rerr := os.ReadFile(ce.LogPath)
	if errors.Is(rerr, fs.ErrNotExist) {
		// CRIU failed before it wrote a line: the error names no file that is not there
		// (review: it named a log CRIU never wrote).
		return forgetLog(err, ce)
	}
	if rerr != nil {
		return err
	}
	f, ferr := os.CreateTemp("", keptLogPattern)
	if ferr != nil {
		return err
	}
	defer f.Close()
	pruneKeptLogs(filepath.Dir(f.Name()), keptLogs)
	if _, werr := f.Write(b); werr != nil {
		return err
	}
	old := ce.LogPath
	ce.LogPath = f.Name()
	// An error that wraps CRIU's (a container restore's removal of what runc made) wrote
	// its message with the log where it was: the copy was named nowhere, and the error named
	// the removed one (crash test).
	if msg := err.Error(); strings.Contains(msg, old) {
		return &keptLogError{msg: strings.ReplaceAll(msg, old, ce.LogPath), err: err}
	}
	return err
}

// keptLogPattern names the kept copies of failed CRIU runs' logs in TMPDIR.
const keptLogPattern = "gpucr-criu-*.log"

// keptLogs is how many kept logs a failure leaves in TMPDIR, the newest: every failed run
// kept one for good, and a host had a thousand (hostile test).
const keptLogs = 50

// pruneKeptLogs removes from dir all but the newest keep of the kept logs this user owns:
// another user's are theirs to keep.
func pruneKeptLogs(dir string, keep int) {
	paths, _ := filepath.Glob(filepath.Join(dir, keptLogPattern))
	type kept struct {
		path string
		mod  time.Time
	}
	var mine []kept
	for _, p := range paths {
		fi, err := os.Lstat(p)
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Geteuid() {
			continue
		}
		mine = append(mine, kept{p, fi.ModTime()})
	}
	if len(mine) <= keep {
		return
	}
	slices.SortFunc(mine, func(a, b kept) int { return b.mod.Compare(a.mod) })
	for _, k := range mine[keep:] {
		_ = os.Remove(k.path) // best effort: a log left is no harm
	}
}

// forgetLog makes ce, within err, name no log: one written before it was known there was
// none says so with the path, which is replaced.
func forgetLog(err error, ce *criu.Error) error {
	old := ce.LogPath
	ce.LogPath = ""
	if msg := err.Error(); old != "" && strings.Contains(msg, "(log: "+old+")") {
		return &keptLogError{msg: strings.ReplaceAll(msg, "(log: "+old+")", "(CRIU wrote no log)"), err: err}
	}
	return err
}

// keptLogError is an error whose message names the kept copy of CRIU's log.
type keptLogError struct {
	msg string
	err error
}

func (e *keptLogError) Error() string { return e.msg }
func (e *keptLogError) Unwrap() error { return e.err }

// exitWait bounds how long a checkpoint waits for the killed tree to be gone.
const exitWait = 30 * time.Second

// waitExited waits until each of pids is gone or a zombie (whose memory and sockets are
// freed) and returns those still running at the deadline.
func waitExited(pids []int, limit time.Duration) []int {
	deadline := time.Now().Add(limit)
	for {
		var left []int
		for _, p := range pids {
			if q, err := proctree.Read(p); err == nil && !q.Zombie {
				left = append(left, p)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// HostInfo identifies this machine for a manifest.
func HostInfo() image.HostInfo {
	h := image.HostInfo{Arch: runtime.GOARCH}
	h.Hostname, _ = os.Hostname()
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		h.Kernel = string(trimNL(b))
	}
	return h
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}
