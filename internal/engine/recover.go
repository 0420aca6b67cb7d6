package engine

import (
	"bytes"
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
	"syscall"
	"time"

	"github.com/gpucr/gpucr/internal/beneath"
	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/hosttune"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/txn"
)

// How long recovery waits for CRIU to let go of a tree after gpucr died (CRIU notices at
// its next message to gpucr and resumes or kills the tree).
const criuLetGoWait = 60 * time.Second

// GPURetryWait is how long a GPU process that must run again is retried: a driver call cut
// off halfway, or made while the process is briefly between states, can fail for a moment.
const GPURetryWait = 30 * time.Second

// Recover finishes the rollback of an operation whose gpucr died, from its journal: a
// checkpoint's workload runs again (container resumed, GPU processes restored and
// unlocked); a restore's tasks are either finished (once their memory was verified and
// filled) or killed. Host settings go back and staging is removed. The record is removed
// once done; an error leaves it for the next try.
func (e *Engine) Recover(ctx context.Context, j *txn.Journal) error {
	rec := j.Record()
	log := e.Logger().With("txn", rec.ID, "op", rec.Op, "target", rec.Target, "phase", rec.Phase)
	log.Warn("gpucr died during this operation: rolling it back")
	start := time.Now()
	if rec.Op == txn.OpRestore && !rec.Committed {
		// A CRIU that hangs would hold the tasks until it gets a word from the dead gpucr:
		// whatever still works in the restore's directories goes first.
		killHolders(log, rec.Paths)
	}
	waitUntraced(rec.Tree, criuLetGoWait)
	log.Info("CRIU has let go of the tree", "waited", time.Since(start))
	var errs []error
	switch rec.Op {
	case txn.OpCheckpoint:
		if final, ok := committedImage(rec); ok && !rec.Committed {
			log.Warn("the checkpoint had committed its image before gpucr died: the image is complete", "image", final)
		}
		if rec.Stored != "" && !rec.Committed && rec.Phase == PhaseCommit {
			// The store's side of the commit is the manifest, written there last.
			log.Warn("gpucr died while storing the checkpoint's manifest: the checkpoint is complete if `gpucr ls` lists it", "stored", rec.Stored)
		}
		if c := rec.Container; c != nil && c.Paused {
			if err := resumeContainer(ctx, c, rec.Tree); err != nil {
				errs = append(errs, err)
			}
		}
		if err := e.resumeGPUs(ctx, rec, nil); err != nil {
			errs = append(errs, err)
		}
	case txn.OpRestore:
		// What the restore created goes unless it is whole: its tasks (at their journaled
		// PIDs) and the container a runtime created for them.
		remove := func() error {
			KillJournaled(rec.Tree)
			if rec.Container != nil {
				return RemoveContainer(ctx, rec.Container)
			}
			return nil
		}
		if rec.Committed {
			if err := e.resumeGPUs(ctx, rec, rec.Remap); err != nil {
				errs = append(errs, fmt.Errorf("%w: %v; the restored processes were killed", ErrGPURestore, err), remove())
			}
		} else if err := remove(); err != nil {
			errs = append(errs, err)
		}
	case txn.OpStaging:
		// Its path, below; and an export's image directory only while it is empty.
		if rec.Image != "" {
			if _, err := image.Load(rec.Image); err == nil {
				log.Warn("the checkpoint is complete and kept: gpucr died before its archive was whole; restore it with gpucr restore --container ID -D DIR (under --new-id while the container runs)", "dir", rec.Image)
			} else if err := os.Remove(rec.Image); err != nil && !errors.Is(err, fs.ErrNotExist) {
				log.Warn("an export's image directory holds something other than an image: kept", "dir", rec.Image, "err", err)
			}
		}
	default:
		errs = append(errs, fmt.Errorf("unknown operation %q", rec.Op))
	}
	if rec.THP != nil {
		if err := hosttune.PutBack(rec.THP.Path, rec.THP.Old); err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range rec.Paths {
		if err := removeAll(p); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", p, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		log.Error("rollback incomplete", "err", err)
		return fmt.Errorf("recover %s of %s: %w", rec.Op, rec.Target, err)
	}
	log.Warn("rolled back")
	if err := j.End(); err != nil {
		return err
	}
	e.endStagingOf(rec)
	for _, name := range rec.Locks {
		txn.ClearTarget(e.JournalRoot, name) // held by a guardian still: it removes them itself
	}
	return nil
}

// committedImage says whether a checkpoint's image is in place, and where: journaled as
// committed, or renamed into place by a gpucr killed before it could journal that; or, of
// an export's staging, whether the image it was to pack is whole.
func committedImage(rec txn.Record) (string, bool) {
	if rec.Op == txn.OpStaging && rec.Image != "" {
		_, err := image.Load(rec.Image)
		return rec.Image, err == nil
	}
	if rec.Op != txn.OpCheckpoint {
		return "", false
	}
	for _, p := range rec.Paths {
		if final, ok := image.CommittedFrom(p); ok {
			return final, true
		}
	}
	return "", rec.Committed
}

// RecoverStale recovers every operation whose gpucr and guardian are both gone, and returns
// their records. Each verb runs it first, so nothing a dead gpucr left waits for an operator.
func (e *Engine) RecoverStale() ([]txn.Record, error) {
	return e.recoverStale(func(txn.Entry) bool { return true })
}

// RecoverStaleStaging is RecoverStale of the stale staging records under root alone: the
// verbs that stage without GPUs or CRIU (pull, fold, import) recover those first, so that
// killed ones' copies, each up to an image, do not pile up beside their destinations and
// fill them (hostile test).
//
// An export's staging, whose image may be a job's only copy, is left to a recovery that
// says where that image is (gpucr recover, the next checkpoint or restore): this one tells
// no one (review).
func RecoverStaleStaging(root string) ([]txn.Record, error) {
	return (&Engine{JournalRoot: root}).recoverStale(func(en txn.Entry) bool { return en.Op == txn.OpStaging && en.Image == "" })
}

// recoverStale is RecoverStale of the records which says.
func (e *Engine) recoverStale(which func(txn.Entry) bool) ([]txn.Record, error) {
	if e.JournalRoot == "" {
		return nil, nil
	}
	entries, err := txn.List(e.JournalRoot)
	if err != nil {
		return nil, err
	}
	var done []txn.Record
	var errs []error
	for _, en := range entries {
		if !which(en) || en.Held || (en.Op == txn.OpStaging && slices.ContainsFunc(en.Paths, heldBeneath(entries))) {
			// A staging directory that a live operation (a guardian's rollback) journals
			// too is its to remove: the operation may still need what is in it.
			continue
		}
		j, err := txn.Claim(e.JournalRoot, en.ID)
		if errors.Is(err, txn.ErrBusy) || errors.Is(err, os.ErrNotExist) {
			continue // someone else recovers it, or just did
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		// The record's targets are locked before anything is rolled back: a live operation
		// that holds one (a later checkpoint of the same process) owns its GPU state now,
		// and a rollback restored and unlocked it under that checkpoint (review).
		locks, _, err := txn.LockTargets(e.JournalRoot, "gpucr PID "+strconv.Itoa(os.Getpid())+" is recovering "+en.ID, en.Locks)
		if errors.Is(err, txn.ErrBusy) {
			j.Release()
			continue // its turn comes once that operation is over
		}
		if err != nil {
			j.Release()
			errs = append(errs, err)
			continue
		}
		if _, ok := committedImage(en.Record); ok {
			en.Committed = true // the caller says finished, not rolled back
		}
		err = e.Recover(context.Background(), j)
		for _, l := range locks {
			l.Release()
		}
		if err != nil {
			j.Release() // stale again, for the next recovery
			errs = append(errs, err)
			continue
		}
		done = append(done, en.Record)
	}
	if err := txn.Sweep(e.JournalRoot); err != nil {
		errs = append(errs, err)
	}
	return done, errors.Join(errs...)
}

// endStagingOf ends the staging records of rec's dead gpucr whose directories rec's
// rollback removed: nothing is left for them to do.
func (e *Engine) endStagingOf(rec txn.Record) {
	if rec.Op == txn.OpStaging || e.JournalRoot == "" {
		return
	}
	entries, err := txn.List(e.JournalRoot)
	if err != nil {
		return // they wait for the next recovery
	}
	kept := func(p string) bool { return !slices.Contains(rec.Paths, p) }
	for _, en := range entries {
		if en.Held || en.Op != txn.OpStaging || en.Owner != rec.Owner || slices.ContainsFunc(en.Paths, kept) {
			continue
		}
		if j, err := txn.Claim(e.JournalRoot, en.ID); err == nil {
			_ = j.End() // a record left is only recovered again
		}
	}
}

// heldBeneath reports whether a path is, or holds, a path that a held record journals.
func heldBeneath(entries []txn.Entry) func(string) bool {
	return func(dir string) bool {
		return slices.ContainsFunc(entries, func(en txn.Entry) bool {
			return en.Held && slices.ContainsFunc(en.Paths, func(p string) bool { return p == dir || strings.HasPrefix(p, dir+"/") })
		})
	}
}

// resumeGPUs brings every GPU process of rec that is still the process it was back to
// running; remap is the device mapping of a restore. A driver call that gpucr's death cut
// off can leave a process briefly between states, so each is retried.
func (e *Engine) resumeGPUs(ctx context.Context, rec txn.Record, remap map[string]map[string]string) error {
	set, err := HeldSet(e.Backends, rec.GPUs)
	if err != nil {
		return err
	}
	for _, p := range set {
		st, err := p.Backend.State(ctx, p.PID)
		e.Logger().Info("GPU process found", "pid", p.PID, "state", st, "err", err)
	}
	start := time.Now()
	if err := set.ResumeRetrying(ctx, remap, GPURetryWait); err != nil {
		return err
	}
	e.Logger().Info("GPU processes resumed", "processes", len(set), "took", time.Since(start))
	return nil
}

// HeldSet is the GPU set of the journaled processes held that are still the processes they
// were: one that exited (a dump that killed its tree) needs nothing.
func HeldSet(backends []gpu.Backend, held []txn.GPUProc) (GPUSet, error) {
	var set GPUSet
	for _, g := range held {
		if !g.Alive() {
			continue
		}
		b, ok := gpu.Named(backends, g.Backend).(gpu.Checkpointer)
		if !ok {
			return nil, fmt.Errorf("process %d holds %s GPU state and the %s backend is not available here", g.PID, g.Backend, g.Backend)
		}
		set = append(set, GPUProc{Backend: b, Process: gpu.Process{PID: g.PID}})
	}
	return set, nil
}

// waitUntraced waits until CRIU has let go of every process of tree that still lives.
func waitUntraced(tree []txn.Proc, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		traced := slices.ContainsFunc(tree, func(p txn.Proc) bool {
			t, err := proctree.Tracer(p.PID)
			return err == nil && t != 0
		})
		if !traced {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// killHolders kills the processes (CRIU, its action scripts) that hold a descriptor in
// one of a dead restore's directories.
func killHolders(log *slog.Logger, dirs []string) {
	var pids []int
	for _, d := range dirs {
		held, err := proctree.Holding(d)
		if err != nil {
			log.Warn("cannot look for processes left in the restore's directories", "err", err)
			return
		}
		pids = append(pids, held...)
	}
	for _, pid := range pids {
		log.Warn("killing a process the restore left running", "pid", pid)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	waitExited(pids, 5*time.Second)
}

// anyAlive says whether a process of tree is still the process it was.
func anyAlive(tree []txn.Proc) bool {
	return slices.ContainsFunc(tree, txn.Proc.Alive)
}

// killForks kills the processes at tree's PIDs that are still forks of the CRIU binary at
// criuPath, started no earlier than since: the tasks of a restore that CRIU was stopped in
// before they were whole. A process at such a PID running a program of its own is not the
// restore's: an image may name any PID, a thread of another user's among them, and kill
// takes it (a hostile test). opened, when not nil, gives the program the image recorded
// for each of its PIDs: a task CRIU had taken that far (its program set, its threads made)
// goes too if it leads its thread group, runs that program, started since and still blocks
// the signals CRIU's restore blocks (inCRIUsRestore).
func killForks(tree []txn.Proc, criuPath string, since uint64, opened map[int]*criuimg.Opened) {
	bin, err := os.Stat(criuPath)
	if err != nil {
		return
	}
	killBackwards(tree, func(p txn.Proc) bool {
		q, err := proctree.Read(p.PID)
		if err != nil || q.Start < since {
			return false
		}
		if exe, err := os.Stat(fmt.Sprintf("/proc/%d/exe", p.PID)); err == nil && os.SameFile(exe, bin) {
			return true
		}
		o := opened[p.PID]
		tgid, err := proctree.ThreadGroup(p.PID)
		exe, lerr := os.Readlink(fmt.Sprintf("/proc/%d/exe", p.PID))
		return err == nil && lerr == nil && tgid == p.PID && o != nil && o.Exe != "" && exe == o.Exe &&
			inCRIUsRestore(p.PID)
	})
}

// criuBlocked are the signals every task CRIU forks for a restore blocks until its restorer
// lets it go (sigfillset less SIGCHLD, in restore_task_with_children): the standard ones
// but SIGKILL, SIGSTOP (which none can block) and SIGCHLD. glibc keeps its own real-time
// ones out of any mask, so those are not asked.
const criuBlocked = (uint64(1)<<31 - 1) &^ (1<<(syscall.SIGKILL-1) | 1<<(syscall.SIGSTOP-1) | 1<<(syscall.SIGCHLD-1))

// inCRIUsRestore says whether the process at pid blocks every signal a task in CRIU's
// restore blocks. A program and a start time are no proof: another user's process that
// took an image PID after CRIU started (the very one that made CRIU fail to fork there)
// and runs the program the image recorded was SIGKILLed by root's rollback (hostile test).
func inCRIUsRestore(pid int) bool {
	m, err := proctree.BlockedSignals(pid)
	return err == nil && m&criuBlocked == criuBlocked
}

// KillJournaled kills the processes of a dead restore's tree that it journaled (or watched)
// as made and that are still the processes they were: a PID taken since by another
// process, or one never journaled with its start (the restore died before its tasks
// existed, and CRIU and what it forked go with the restore's directories, killHolders), is
// not the restore's.
func KillJournaled(tree []txn.Proc) {
	killBackwards(tree, func(p txn.Proc) bool { return p.Start != 0 && p.Alive() })
}

// killBackwards kills the processes of tree that made says a restore made, children first
// (tree's order reversed), and waits briefly for them.
func killBackwards(tree []txn.Proc, made func(txn.Proc) bool) {
	var pids []int
	for i := len(tree) - 1; i >= 0; i-- {
		if made(tree[i]) {
			_ = syscall.Kill(tree[i].PID, syscall.SIGKILL)
			pids = append(pids, tree[i].PID)
		}
	}
	waitExited(pids, 5*time.Second)
}

// resumeContainer thaws a container a checkpoint paused, whose processes were tree. A
// container that runs already (a runtime whose dump failed may have resumed it) or whose
// processes are all gone (it stopped, or was deleted) has nothing left frozen: the rollback
// is done, not failed forever at every later gpucr run.
func resumeContainer(ctx context.Context, c *txn.Container, tree []txn.Proc) error {
	if len(c.Runtime) == 0 {
		if anyAlive(tree) {
			return fmt.Errorf("container %s is left paused: no runtime recorded", c.ID)
		}
		return nil
	}
	out, err := runRuntime(ctx, c, "resume", c.ID)
	if err == nil || runtimeStatus(ctx, c) == "running" || !anyAlive(tree) {
		return nil
	}
	return fmt.Errorf("container %s is left paused (%s resume): %w: %s", c.ID, c.Runtime[0], err, bytes.TrimSpace(out))
}

// runtimeStatus is the status the runtime gives container c ("running", "paused", ...), or
// "" when it cannot say.
func runtimeStatus(ctx context.Context, c *txn.Container) string {
	st, _ := runtimeState(ctx, c)
	return st.Status
}

// containerState is what a runtime's `state` says of a container.
type containerState struct {
	Status  string    `json:"status"`
	Bundle  string    `json:"bundle"`
	Created time.Time `json:"created"`
}

// runtimeState is the runtime's state of container c; false when it cannot say.
func runtimeState(ctx context.Context, c *txn.Container) (containerState, bool) {
	var st containerState
	out, err := runtimeCmd(ctx, c, "state", c.ID).Output() // its warnings go to stderr
	return st, err == nil && json.Unmarshal(out, &st) == nil
}

// madeByRestore says whether the container under c's ID is the one the journaled restore's
// runtime made (c.Since set): made since it started, from its bundle. One the runtime
// cannot load is judged by its state directory, made no earlier than the runtime started.
func madeByRestore(ctx context.Context, c *txn.Container) bool {
	if c.Since.IsZero() {
		return true // an older record, or a removal by the restore that just failed itself
	}
	if st, ok := runtimeState(ctx, c); ok {
		return !st.Created.Before(c.Since) && st.Bundle == c.Bundle
	}
	fi, err := os.Lstat(c.StateDir)
	return err != nil || !fi.ModTime().Before(c.Since)
}

// runRuntime runs the journaled runtime command of c (binary and global flags) with args.
func runRuntime(ctx context.Context, c *txn.Container, args ...string) ([]byte, error) {
	return runtimeCmd(ctx, c, args...).CombinedOutput()
}

// runtimeCmd is the journaled runtime command of c with args.
func runtimeCmd(ctx context.Context, c *txn.Container, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, c.Runtime[0], append(slices.Clone(c.Runtime[1:]), args...)...)
}

// RemoveContainer deletes a container a restore created, whole or half-made. The runtime
// that created it may have been killed, and CRIU, its child, may still be winding down:
// deletion is retried until the runtime no longer knows the container.
func RemoveContainer(ctx context.Context, c *txn.Container) error {
	if len(c.Runtime) == 0 {
		return fmt.Errorf("container %s may be left: no runtime recorded", c.ID)
	}
	if err := CheckContainerID(c.ID); err != nil {
		return fmt.Errorf("container left as it is: %w", err)
	}
	if c.StateDir != "" && filepath.Base(c.StateDir) != c.ID {
		return fmt.Errorf("container %s left as it is: its state directory %s is not the runtime's for it", c.ID, c.StateDir)
	}
	if !madeByRestore(ctx, c) {
		return nil // another's, made under the ID: nothing of the restore's is there
	}
	deadline := time.Now().Add(criuLetGoWait)
	for {
		// A runtime killed halfway through a restore leaves the container's root file
		// system bound inside its state directory, and runc's delete of a container it
		// cannot load removes that directory recursively: unbound first, or the root file
		// system is emptied.
		if c.StateDir != "" {
			if err := detachMounts(c.StateDir); err != nil {
				return err
			}
		}
		out, err := runRuntime(ctx, c, "delete", "--force", c.ID)
		if _, serr := runRuntime(ctx, c, "state", c.ID); serr != nil {
			if c.StateDir == "" {
				return nil // gone, or never created
			}
			return removeAll(c.StateDir)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("container %s is left (%s delete --force): %v: %s", c.ID, c.Runtime[0], err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// removeAll removes path, first detaching whatever is mounted beneath it (a CRIU killed
// halfway leaves its cgroup yard there), and never descending through a mount it could not
// detach.
func removeAll(path string) error {
	if err := detachMounts(path); err != nil {
		return err
	}
	return beneath.RemoveAll(path)
}

// detachMounts lazily unmounts path and every mount beneath it, deepest first.
func detachMounts(path string) error {
	ms, err := proctree.ReadMounts("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var under []string
	for _, m := range ms {
		if m.Dir == path || strings.HasPrefix(m.Dir, path+"/") {
			under = append(under, m.Dir)
		}
	}
	slices.SortFunc(under, func(a, b string) int { return len(b) - len(a) })
	for _, m := range under {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			return fmt.Errorf("unmount %s: %w", m, err)
		}
	}
	return nil
}
