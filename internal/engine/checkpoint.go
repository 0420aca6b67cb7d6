package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"time"

	"github.com/gpucr/gpucr/internal/amd/plugin"
	"github.com/gpucr/gpucr/internal/crashpoint"
	"github.com/gpucr/gpucr/internal/criu"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/memfill"
	"github.com/gpucr/gpucr/internal/pageserver"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/safety"
	"github.com/gpucr/gpucr/internal/store/chunked"
	"github.com/gpucr/gpucr/internal/txn"
)

// CheckpointRequest is what to checkpoint, where, and how.
type CheckpointRequest struct {
	PID          int
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
	// gpucr's page server: slower, kept to compare the two (GPUCR_CRIU_WRITES_PAGES=1).
	CRIUWritesPages bool
	criu.Options
}

// Checkpoint writes an image of the tree rooted at r.PID to r.Dir. On any failure the tree
// keeps running with its GPUs unlocked, and nothing appears at r.Dir.
func (e *Engine) Checkpoint(ctx context.Context, r CheckpointRequest) (*image.Manifest, error) {
	tree, err := e.target(r.PID)
	if err != nil {
		return nil, err
	}
	op, err := e.Begin(txn.OpCheckpoint, fmt.Sprintf("PID %d", r.PID), PIDLock(r.PID))
	if err != nil {
		return nil, err
	}
	defer op.End()
	gpus, snaps, err := FindGPUProcs(ctx, e.Backends, proctree.PIDs(tree))
	if err != nil {
		return nil, err
	}
	if err := safety.Check(tree, gpus.PIDs()); err != nil {
		return nil, err // before anything is locked: the workload is untouched
	}
	stage, err := e.BeginStaging(op, r.Dir, r.Scratch, tree, gpus)
	if err != nil {
		return nil, err
	}
	defer stage.Abort() // a no-op once committed; a streamed image is never committed here
	if r.Stream != nil {
		defer r.Stream.Abort() // after Finish, a no-op
	}
	t := e.NewTimer(op)
	if pid := plugin.UsesKFD(proctree.PIDs(tree)); pid != 0 {
		if e.AMDPluginDir == "" {
			return nil, fmt.Errorf("process %d uses an AMD GPU (/dev/kfd): %w", pid, plugin.ErrMissing)
		}
		r.PluginDir = e.AMDPluginDir // CRIU's plugin saves the /dev/kfd state within the dump
	}
	m := &image.Manifest{
		GpucrVersion: e.Version,
		CRIUVersion:  e.CRIU.VersionString(),
		Created:      time.Now().UTC(),
		Host:         HostInfo(),
		RootPID:      r.PID,
		Options: image.Options{
			LeaveRunning: r.LeaveRunning, ShellJob: r.ShellJob, TCPEstablished: r.TCPEstablished,
			ExtUnixSk: r.ExtUnixSk, FileLocks: r.FileLocks, NetworkLock: r.NetworkLock,
		},
		GPUs: snaps,
	}
	for _, p := range tree {
		m.Processes = append(m.Processes, image.Process{PID: p.PID, PPID: p.PPID, Command: p.Command, Threads: p.Threads})
	}

	// From here on the GPUs may be locked: every failure path resumes them.
	rollback := func(cause error) error {
		if len(gpus) == 0 {
			return cause
		}
		// The caller's context may be the cancelled one; rollback must still run.
		if err := gpus.Resume(context.WithoutCancel(ctx), nil); err != nil {
			return fmt.Errorf("%w; rolling back the GPUs also failed, the workload may be stuck: %v", cause, err)
		}
		e.Logger().Info("rolled back: GPU processes resumed", "processes", len(gpus))
		return cause
	}
	if len(gpus) > 0 {
		defer e.TuneHost(op)()
		if err := t.Run(PhaseGPULock, func() error { return gpus.Lock(ctx, r.LockTimeout) }); err != nil {
			return nil, rollback(fmt.Errorf("lock GPU processes: %w", err))
		}
		if err := t.Run(PhaseGPUCheckpoint, func() error { return gpus.Checkpoint(ctx) }); err != nil {
			return nil, rollback(fmt.Errorf("checkpoint GPU state: %w", err))
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, rollback(fmt.Errorf("checkpoint interrupted: %w", err))
	}

	// The image is committed while CRIU still holds the tree frozen (post-dump): if the
	// commit fails, CRIU resumes the tree instead of killing it, so nothing is lost.
	// The large runs of the processes' memory (a GPU process's staged device memory)
	// are gpucr's to save, on all cores, once CRIU has frozen the tree; CRIU leaves them out.
	var saved []memfill.Range
	if !r.CRIUWritesPages && r.PluginDir == "" {
		if saved, err = memfill.Select(tree); err != nil {
			return nil, rollback(err)
		}
		if len(saved) > 0 {
			ranges := filepath.Join(stage.LogsDir(), "gpucr-skip-ranges")
			if err := memfill.WriteRanges(ranges, saved); err != nil {
				return nil, rollback(err)
			}
			r.Env = append(slices.Clip(r.Env), memfill.SkipEnv+"="+ranges)
		}
	}
	commit := &committer{ctx: ctx, stage: stage, manifest: m, timer: t, stream: r.Stream, saved: saved, op: op}
	dump := criu.DumpRequest{
		PID: r.PID, ImagesDir: stage.CRIUDir(), WorkDir: stage.LogsDir(),
		LeaveRunning: r.LeaveRunning, Options: r.Options,
	}
	if !r.CRIUWritesPages || r.Stream != nil {
		// CRIU sends the pages to gpucr, which writes (or stores) and checksums them on all
		// cores while CRIU's one thread keeps sending.
		var sink pageserver.Sink = stagingSink{stage}
		if r.Stream != nil {
			sink = storeSink{r.Stream}
		}
		srv, err := pageserver.Start(stage.CRIUDir(), sink)
		if err != nil {
			return nil, rollback(err)
		}
		defer srv.Close()
		commit.pages, dump.PageServerPort = srv, srv.Port()
	}
	commit.dumpStart = time.Now()
	op.Phase(PhaseCRIUDump)
	e.reporter().Start(PhaseCRIUDump)
	crashpoint.Hit("start " + PhaseCRIUDump)
	err = e.CRIU.Dump(ctx, dump, commit)
	if err != nil {
		if !commit.reached {
			e.reporter().Done(PhaseCRIUDump, time.Since(commit.dumpStart))
		}
		switch {
		case commit.err != nil:
			err = commit.err
		case r.Stream != nil && r.Stream.Err() != nil:
			// The store failed first; CRIU only saw its page server hang up.
			err = fmt.Errorf("store memory pages: %w", r.Stream.Err())
		case commit.pages != nil && commit.pages.Err() != nil:
			// gpucr's page server failed first (a full disk, say); CRIU saw it hang up.
			err = commit.pages.Err()
		default:
			err = keepLog(err)
		}
		return nil, rollback(err)
	}

	if !r.LeaveRunning {
		// CRIU has killed the tree; return only once its PIDs and sockets are free, so that
		// a restore right after this one does not find them taken.
		if left := waitExited(proctree.PIDs(tree), exitWait); len(left) > 0 {
			e.Logger().Warn("checkpointed processes are still exiting", "pids", left)
		}
	}
	if r.LeaveRunning && len(gpus) > 0 {
		if err := t.Run(PhaseGPUResume, func() error { return gpus.Resume(context.WithoutCancel(ctx), nil) }); err != nil {
			return m, fmt.Errorf("image written to %s, but resuming the GPU processes failed: %w", r.Dir, err)
		}
	}
	m.Phases = t.Phases
	return m, nil
}

// PIDLock names the lock that keeps two gpucr operations off one process tree.
func PIDLock(pid int) string { return fmt.Sprintf("pid-%d", pid) }

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

// committer commits the staged image from CRIU's post-dump notification.
type committer struct {
	criu.NoNotify
	ctx       context.Context
	stage     *image.Staging
	manifest  *image.Manifest
	timer     *Timer
	dumpStart time.Time
	reached   bool // CRIU finished writing and called PostDump
	err       error
	// pages is the page server CRIU sends the pages to; stream, the store it passes them
	// on to for a streamed checkpoint.
	pages  *pageserver.Server
	stream *chunked.Stream
	saved  []memfill.Range // memory gpucr saves itself once CRIU has frozen the tree
	op     *Op
}

func (c *committer) PostDump() error {
	d := time.Since(c.dumpStart)
	c.reached = true
	c.timer.Phases = append(c.timer.Phases, image.Phase{Name: PhaseCRIUDump, Duration: d})
	c.timer.r.Done(PhaseCRIUDump, d)
	crashpoint.Hit("end " + PhaseCRIUDump)
	if err := c.ctx.Err(); err != nil {
		c.err = fmt.Errorf("checkpoint interrupted: %w", err)
		return c.err
	}
	if c.pages != nil {
		if _, err := c.pages.Wait(c.ctx); err != nil {
			c.err = err
			return err
		}
	}
	c.err = SaveAndCommit(c.ctx, c.timer, c.stage, c.manifest, c.saved, c.stream)
	if c.err == nil {
		c.err = c.op.Update(func(r *txn.Record) { r.Committed = true })
	}
	return c.err
}

// SaveAndCommit finishes a checkpoint whose tree CRIU has dumped and still holds frozen: the
// memory gpucr saves itself goes into the staged image, or into s for a streamed checkpoint,
// and the image is committed, or stored in s. m's memory counts all of it.
func SaveAndCommit(ctx context.Context, t *Timer, stage *image.Staging, m *image.Manifest, saved []memfill.Range, s *chunked.Stream) error {
	if s != nil {
		if len(saved) > 0 {
			err := t.Run(PhaseMemorySave, func() error {
				return memfill.SaveTo(ctx, saved, func(path string) (memfill.Receiver, error) { return s.Create(path) })
			})
			if err != nil {
				return err
			}
		}
		return t.Run(PhaseCommit, func() error {
			m.Phases = slices.Clone(t.Phases)
			return storeStreamed(ctx, stage, m, s)
		})
	}
	var memFiles []image.File
	if len(saved) > 0 {
		err := t.Run(PhaseMemorySave, func() (err error) {
			memFiles, err = memfill.Save(ctx, stage.Dir(), saved)
			return err
		})
		if err != nil {
			return err
		}
	}
	pages, err := PagesBytes(stage.CRIUDir())
	if err != nil {
		return err
	}
	m.MemoryBytes = pages
	for _, f := range memFiles {
		m.MemoryBytes += uint64(f.Size)
	}
	// The commit's own time cannot be in the manifest it checksums; the caller's copy has it.
	m.Phases = slices.Clone(t.Phases)
	return t.Run(PhaseCommit, func() error { return stage.CommitWith(m, memFiles) })
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

func (k stagingSink) Create(name string) (pageserver.File, error) { return k.s.CreatePages(name) }

// StoreSink names the page files a streamed checkpoint receives as they sit in an image.
func StoreSink(s *chunked.Stream) pageserver.Sink { return storeSink{s} }

type storeSink struct{ s *chunked.Stream }

func (k storeSink) Create(name string) (pageserver.File, error) {
	return k.s.Create(image.CRIUDir + "/" + name)
}

// PagesBytes sums CRIU's page files: the memory the image holds.
func PagesBytes(dir string) (uint64, error) {
	matches, err := filepath.Glob(filepath.Join(dir, "pages-*.img"))
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
	if rerr != nil {
		return err
	}
	f, ferr := os.CreateTemp("", "gpucr-criu-*.log")
	if ferr != nil {
		return err
	}
	defer f.Close()
	if _, werr := f.Write(b); werr == nil {
		ce.LogPath = f.Name()
	}
	return err
}

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

// target checks that pid may be checkpointed and returns its tree.
func (e *Engine) target(pid int) ([]proctree.Process, error) {
	if os.Geteuid() != 0 {
		return nil, ErrNotRoot
	}
	switch {
	case pid <= 0:
		return nil, fmt.Errorf("%w: %d is not a valid PID", ErrBadTarget, pid)
	case pid == 1:
		return nil, fmt.Errorf("%w: PID 1 is the init process", ErrBadTarget)
	case pid == os.Getpid():
		return nil, fmt.Errorf("%w: PID %d is gpucr itself", ErrBadTarget, pid)
	}
	tree, err := proctree.Tree(pid)
	if err != nil {
		return nil, err
	}
	if slices.Contains(proctree.PIDs(tree), os.Getpid()) {
		return nil, fmt.Errorf("%w: gpucr itself runs inside the tree of PID %d", ErrBadTarget, pid)
	}
	return tree, nil
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
