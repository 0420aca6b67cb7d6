package engine

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/gpucr/gpucr/internal/crashpoint"
	"github.com/gpucr/gpucr/internal/criu"
	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/memfill"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/txn"
)

// A Target is what a checkpoint acts on, and how CRIU reaches it: a process tree that
// gpucr dumps through CRIU's RPC, or a container whose runtime drives CRIU. The sequence
// around it (GPU state, journal, memory, commit, rollback) is the engine's alone.
type Target interface {
	// Open checks that the target may be checkpointed and returns its processes as the
	// host numbers them, root first.
	Open(ctx context.Context) ([]proctree.Process, error)
	// What names it in messages and the journal: "PID 4242", "container web".
	What() string
	// Locks are the names that keep other gpucr operations off it while this one runs.
	Locks() []string
	// ImagePID is how the image numbers host process pid: the same for a process tree,
	// the container's own PID for a container (its restore gets new host PIDs).
	ImagePID(pid int) (int, error)
	// CRIUPlugins says whether CRIU plugins (a gpu.CRIUPlugin backend's) can be loaded for it.
	CRIUPlugins() bool
	// FilePlugins says whether a gpu.FileCarrier's CRIU plugin can be loaded for it.
	FilePlugins() bool
	// RuntimeStdio says whether a runtime gives its restored processes their standard
	// descriptors again (runc a container's, from descriptors.json): their pipes to
	// processes outside the tree are then no loss.
	RuntimeStdio() bool
	// CarriesSemaphores says whether its checkpoint may carry POSIX semaphores held under a
	// deleted name (safety.Semaphores): gpucr asks CRIU for their links and records them
	// in the image, where it drives CRIU's dump itself; a runtime dumps without them.
	CarriesSemaphores() bool
	// Freeze stops the tree before its dump where CRIU's own freeze is not enough, pushing
	// what undoes that, and returns the tree as it stopped (processes may have come and gone
	// since Open); nil keeps the tree Open returned. Most targets need nothing.
	Freeze(ctx context.Context, op *Op, undo *Undo) ([]proctree.Process, error)
	// Dump has CRIU dump the tree as d says (d.PID is the target's to fill) and calls the
	// hooks: Frozen where it knows the tree is stopped, Commit once every file is written,
	// with the tree still frozen; Commit's error fails the dump, and the tree must then run
	// on as before.
	Dump(ctx context.Context, d criu.DumpRequest, h DumpHooks) error
	// Describe writes the target's own files into the staged image directory dir.
	Describe(dir string) error
	// Release ends the tree's part once its image is committed: it is gone, or with
	// leaveRunning it runs again (its GPUs are the engine's to resume).
	Release(ctx context.Context, leaveRunning bool) error
}

// DumpHooks are the engine's steps inside a target's dump.
type DumpHooks struct {
	// Frozen says the tree is stopped and stays so until Commit returns: memory may be
	// copied out of it from then on, beside CRIU's dump. A target that cannot tell does
	// not call it.
	Frozen func()
	// Commit finishes the checkpoint once CRIU has written every file.
	Commit func() error
}

// Tree is the target for the process tree rooted at pid, dumped through CRIU's RPC.
func (e *Engine) Tree(pid int) Target { return &processTree{e: e, pid: pid} }

type processTree struct {
	e    *Engine
	pid  int
	tree []proctree.Process
	// ownPIDs: the root is the init of a PID namespace of its own, which CRIU dumps and
	// restores as such; the image numbers the tree as that namespace does.
	ownPIDs bool
}

func (p *processTree) What() string            { return fmt.Sprintf("PID %d", p.pid) }
func (p *processTree) Locks() []string         { return treeLocks(proctree.PIDs(p.tree)) }
func (p *processTree) CRIUPlugins() bool       { return true }
func (p *processTree) FilePlugins() bool       { return true }
func (p *processTree) RuntimeStdio() bool      { return false }
func (p *processTree) CarriesSemaphores() bool { return true }
func (p *processTree) Describe(string) error   { return nil }

func (p *processTree) ImagePID(pid int) (int, error) {
	if p.ownPIDs {
		return proctree.InnerPID(pid)
	}
	return pid, nil
}

// Freeze does nothing: CRIU freezes the tree itself at the start of its dump, and thaws
// it if the dump fails.
func (p *processTree) Freeze(context.Context, *Op, *Undo) ([]proctree.Process, error) {
	return nil, nil // CRIU freezes the tree itself, as it finds it
}

func (p *processTree) Open(context.Context) ([]proctree.Process, error) {
	pid := p.pid
	switch {
	case pid <= 0:
		return nil, fmt.Errorf("%w: %d is not a valid PID", ErrBadTarget, pid)
	case pid == 1:
		return nil, fmt.Errorf("%w: PID 1 is the init process", ErrBadTarget)
	case pid == os.Getpid():
		return nil, fmt.Errorf("%w: PID %d is gpucr itself", ErrBadTarget, pid)
	}
	if tgid, err := proctree.ThreadGroup(pid); err == nil && tgid != pid {
		return nil, fmt.Errorf("%w: %d is a thread of process %d: checkpoint %d", ErrBadTarget, pid, tgid, tgid)
	}
	tree, err := proctree.Tree(pid)
	if err != nil {
		return nil, err
	}
	if tree[0].Kernel {
		return nil, fmt.Errorf("%w: PID %d is a kernel thread (%s), with nothing of a process to checkpoint", ErrBadTarget, pid, tree[0].Command)
	}
	if tree[0].Zombie {
		return nil, fmt.Errorf("%w: PID %d (%s) has exited, and waits for its parent to reap it: nothing is left to checkpoint", ErrBadTarget, pid, tree[0].Command)
	}
	// CRIU seizes every process with ptrace, which a tracer already attached forbids: its
	// failure named only a firewall rule it could not remove (hostile test).
	for _, q := range tree {
		tracer, err := proctree.Tracer(q.PID)
		if err != nil || tracer == 0 {
			continue
		}
		if t, err := proctree.Read(tracer); err == nil && t.Command == "criu" {
			// Another operation's CRIU (a gpucr checkpoint of the same tree, before this one
			// could reach its lock): told to detach a tracer, a user killed that CRIU, the
			// one thing that loses its job (crash test).
			return nil, fmt.Errorf("%w: process %d (%s) of the tree is held by CRIU (PID %d), which another checkpoint or restore runs: wait for it to finish",
				txn.ErrBusy, q.PID, q.Command, tracer)
		}
		return nil, fmt.Errorf("%w: process %d (%s) of the tree is traced by PID %d (a debugger, strace?), and CRIU cannot seize a traced process: detach the tracer and try again",
			ErrBadTarget, q.PID, q.Command, tracer)
	}
	if slices.Contains(proctree.PIDs(tree), os.Getpid()) {
		return nil, fmt.Errorf("%w: gpucr itself runs inside the tree of PID %d", ErrBadTarget, pid)
	}
	if p.ownPIDs, err = ownNamespaces(pid); err != nil {
		return nil, err
	}
	if err := nestedNamespaces(tree); err != nil {
		return nil, err
	}
	if err := leaderlessSessions(tree); err != nil {
		return nil, err
	}
	p.tree = tree
	return tree, nil
}

// ownNamespaces refuses a tree whose root has a mount namespace of its own, and says
// whether it has a PID namespace of its own. CRIU dumps such a mount namespace but
// restores it only into a root directory that a container runtime gives it: the image
// could never come back as a process tree.
func ownNamespaces(pid int) (ownPIDs bool, err error) {
	mnt, err := proctree.OwnNamespace(pid, "mnt")
	if err != nil {
		return false, err
	}
	if mnt {
		return false, fmt.Errorf("%w: PID %d has a mount namespace of its own, which gpucr cannot restore as a process tree; "+
			"run it as a runc container and checkpoint --container, or without unsharing its mounts", ErrBadTarget, pid)
	}
	if ownPIDs, err = proctree.OwnNamespace(pid, "pid"); err != nil || !ownPIDs {
		return false, err
	}
	if inner, err := proctree.InnerPID(pid); err != nil || inner != 1 {
		return false, errors.Join(err, fmt.Errorf("%w: PID %d is PID %d of a PID namespace of its own, and CRIU takes such a tree "+
			"only whole: checkpoint the namespace's first process (its PID 1)", ErrBadTarget, pid, inner))
	}
	return true, nil
}

// nestedNamespaces refuses a tree in which a process below the root has a mount, network
// or cgroup namespace other than the root's (a job step under unshare, bwrap, a container
// tool): CRIU dumps it, then cannot restore it ("Can't restore sub-task in NS", "No set
// found"), and the checkpoint would have ended the job for an image that never restores
// (hostile test, review). CRIU itself refuses the others (pid, user, time) at dump, and
// restores uts and ipc. A process that exited meanwhile is no longer the tree's.
func nestedNamespaces(tree []proctree.Process) error {
	root := tree[0]
	for _, q := range tree[1:] {
		for _, kind := range []string{"mnt", "net", "cgroup"} {
			same, err := proctree.SameNamespace(root.PID, q.PID, kind)
			if errors.Is(err, fs.ErrNotExist) {
				break
			}
			if err != nil {
				return err
			}
			if !same {
				return fmt.Errorf("%w: process %d (%s) of the tree has a %s namespace of its own, which CRIU cannot restore below a tree's root: "+
					"run the job without unsharing it, or as a container and checkpoint --container", ErrBadTarget, q.PID, q.Command, namespaceNames[kind])
			}
		}
	}
	return nil
}

var namespaceNames = map[string]string{"mnt": "mount", "net": "network", "cgroup": "cgroup"}

// leaderlessSessions refuses a tree with a process in a session whose leader has exited
// (a child of a subreaper root, its parent having called setsid and gone): CRIU restores
// such a session under a leader of its own making, which exits, and the process ends up
// under PID 1, outside the tree the next checkpoint takes (hostile test). A session led by
// a process of the tree, or the root's own, is restored as it was.
func leaderlessSessions(tree []proctree.Process) error {
	root := tree[0]
	inTree := map[int]bool{}
	for _, q := range tree {
		inTree[q.PID] = true
	}
	for _, q := range tree[1:] {
		if q.Session != root.Session && !inTree[q.Session] {
			return fmt.Errorf("%w: process %d (%s) of the tree is in session %d, whose leader has exited: CRIU would restore it outside the tree, "+
				"under PID 1, where the next checkpoint would leave it; start it from a process that stays, or checkpoint it on its own",
				ErrBadTarget, q.PID, q.Command, q.Session)
		}
	}
	return nil
}

// Dump reports the tree frozen at CRIU's query-ext-files notification (CRIU has seized
// every task, and dumped nothing yet) and commits from its post-dump notification, while
// CRIU still holds the tree: CRIU resumes the tree when the notification fails and kills
// it (or, leaving it running, thaws it) when it succeeds.
func (p *processTree) Dump(ctx context.Context, d criu.DumpRequest, h DumpHooks) error {
	d.PID = p.pid
	d.NetworkLock = p.networkLock(d.Flags)
	return p.e.CRIU.Dump(ctx, d, dumpNotify{h: h, same: p.same})
}

// networkLock is the network lock the dump runs with. CRIU's nftables lock of a tree in
// gpucr's own network namespace is a table in that namespace, hooked into every packet's
// way in and out, that only a restore of the image on this host removes: a checkpoint moved
// to another host, or never restored, left it for good (hostile test: 953 on one host, and
// 1000 took a loopback round trip from 6 to 170 us). It holds only the established TCP
// connections, none without --tcp-established (CRIU dumps none then), so such a dump
// skips it. A tree with a network namespace of its own keeps it: the lock is in there.
func (p *processTree) networkLock(f criu.Flags) string {
	if f.TCPEstablished || f.NetworkLock != "" && f.NetworkLock != "nftables" {
		return f.NetworkLock
	}
	if own, err := proctree.OwnNamespace(p.pid, "net"); err != nil || own {
		return f.NetworkLock
	}
	return "skip"
}

// same fails unless the root CRIU seized is still the process Open read: CRIU seizes by PID
// alone, and a root that exited since (the GPU lock takes seconds) could have had its PID
// taken by another process, which would then be dumped under this one's image.
func (p *processTree) same() error {
	if !proctree.Same(p.pid, p.tree[0].Start) {
		return fmt.Errorf("%w: PID %d exited while it was checkpointed, and the PID is another process's now: not checkpointed", ErrBadTarget, p.pid)
	}
	return nil
}

type dumpNotify struct {
	criu.NoNotify
	h    DumpHooks
	same func() error
}

// Seized checks, once CRIU holds the tree (so that its PIDs can no longer change hands),
// that it is the tree gpucr read; CRIU resumes the tree when this fails.
func (n dumpNotify) Seized() error {
	if err := n.same(); err != nil {
		return err
	}
	n.h.Frozen()
	return nil
}

func (n dumpNotify) PostDump() error { return n.h.Commit() }

// Release returns, for a killed tree, only once its PIDs and sockets are free, so that a
// restore right after this checkpoint does not find them taken.
func (p *processTree) Release(_ context.Context, leaveRunning bool) error {
	if leaveRunning {
		return nil
	}
	if left := waitExited(proctree.PIDs(p.tree), exitWait); len(left) > 0 {
		p.e.Logger().Warn("checkpointed processes are still exiting", "pids", left)
	}
	return nil
}

// PIDLock names the lock that keeps two gpucr operations off one process tree.
func PIDLock(pid int) string { return fmt.Sprintf("pid-%d", pid) }

// treeLocks are the locks of every process of a tree: an operation on any process of it,
// or on a tree that shares one (a child checkpointed while its parent's tree is restored),
// waits for this one.
func treeLocks(pids []int) []string {
	out := make([]string, len(pids))
	for i, pid := range pids {
		out[i] = PIDLock(pid)
	}
	return out
}

// ContainerLock names the lock that keeps two gpucr operations off one container.
func ContainerLock(id string) string { return "container-" + id }

// containerID is what runc takes as a container's ID. A restore gives it a state directory
// (the runtime's root joined with the ID) and a lock, which a rollback removes: an ID that
// is a path, ".", or "..", would have root remove what it names.
var containerID = regexp.MustCompile(`^[\w+,.-]+$`)

// CheckContainerID refuses an ID runc would refuse, or one that names anything but one entry
// of a directory.
func CheckContainerID(id string) error {
	// Nor one that begins with "-", which runc, given it as an argument, reads as an option
	// ("-h" printed runc's help; hostile test).
	if !containerID.MatchString(id) || id == "." || id == ".." || strings.HasPrefix(id, "-") {
		return fmt.Errorf("%q is not a container ID (letters, digits and _ + , . - only, not first -; not . or ..)", id)
	}
	if len(id) > maxContainerID {
		return fmt.Errorf("the container ID is %d characters long: gpucr takes at most %d", len(id), maxContainerID)
	}
	return nil
}

// maxContainerID keeps an ID's lock file (ContainerLock, with ".lock") within the 255 bytes
// a file name may have: a longer one failed at the lock, "file name too long".
const maxContainerID = 255 - len("container-") - len(".lock")

// A RestoreTarget is what an image is restored as, and how CRIU is driven to do it: a
// process tree through CRIU's RPC, or a container through its runtime. The checks, the
// journal, verification, memory plan and device state around it are the engine's.
type RestoreTarget interface {
	// Open reads what the target needs of the image at dir, before anything is locked.
	Open(ctx context.Context, dir string, m *image.Manifest) error
	// What names it in messages and the journal; Locks keep other operations off it.
	What() string
	Locks() []string
	// Check refuses, before anything changes, a restore that would fail halfway here (a
	// PID or file the image needs taken or missing).
	Check() error
	// CRIUPlugins says whether CRIU plugins (a gpu.CRIUPlugin backend's) can be loaded for it.
	CRIUPlugins() bool
	// FilePlugins says whether a gpu.FileCarrier's CRIU plugin can be loaded for it.
	FilePlugins() bool
	// CarriesSemaphores says whether an image's linkedFiles (the semaphores a process-tree
	// checkpoint carries) may be made on this host for it: a runtime's restore has none.
	CarriesSemaphores() bool
	// Restore has CRIU restore s.ImagesDir, holding every task before it resumes until
	// s.Verified passed and s.Fill is written, then calling s.Whole. It journals in op what
	// it creates before creating it.
	Restore(ctx context.Context, op *Op, s RestoreSpec) (*Restored, error)
	// Remove kills what Restore created after cause, and says so in the error it returns.
	Remove(ctx context.Context, cause error) error
}

// RestoreSpec is how a target's CRIU restores an image.
type RestoreSpec struct {
	criu.RestoreRequest
	// Checked is the image's CRIU directory as the restore checked it: ImagesDir may be a
	// view of it (memfill), whose links gpucr's own reads of the image refuse.
	Checked string
	// Reopened is the owner and kind of each file the image reopens, as recorded.
	Reopened []image.HostFile
	Timer    *Timer
	// Fill is the memory gpucr writes itself into the held tasks; nil when CRIU restores all.
	Fill *memfill.Plan
	// Procs are the image's processes and GPU processes, as the image numbers them, for a
	// target that restores them at those PIDs to journal before CRIU creates them.
	Procs func() ([]txn.Proc, []txn.GPUProc)
	// Verified blocks until the image's memory is verified and says whether it is whole.
	Verified func() error
	// Created journals the processes the restore made, as soon as they exist and before
	// anything else: made maps their image PIDs to their host PIDs. Only these are ever
	// killed by a rollback from the journal, and only while they are the processes they were.
	Created func(made map[int]int) error
	// Whole journals that the tasks are verified and filled.
	Whole func() error
}

// Restored is what a target's restore created.
type Restored struct {
	Root int // host PID of the root task
	// Host maps the image's PID of each process the restore made to its host PID: GPU
	// state is restored only into these (an image may list any PID, another user's
	// thread's among them).
	Host   map[int]int
	Filled time.Duration
	Stats  *criuimg.RestoreStats // CRIU's own account, when it could be read
	// FS is the root directory the restored processes see where it is not the host's (a
	// container's, /proc/PID/root): its device nodes say which GPUs they can reach.
	FS string
}

// TreeImage is the restore target of an image of a process tree, restored at the PIDs it
// had through CRIU's RPC.
func (e *Engine) TreeImage() RestoreTarget { return &treeImage{e: e} }

type treeImage struct {
	e   *Engine
	dir string
	m   *image.Manifest
	// made are the processes the restore made, by host PID and start time, once CRIU has
	// restored them (its post-restore notification): what a rollback kills.
	made []txn.Proc
	// opened is what the image's processes held (their programs among it), and criuStart
	// when the restore's CRIU started: how a task CRIU took far before it was killed is known.
	opened    map[int]*criuimg.Opened
	criuStart uint64
}

func (ti *treeImage) Open(_ context.Context, dir string, m *image.Manifest) error {
	ti.dir, ti.m = dir, m
	return nil
}

func (ti *treeImage) What() string { return "image " + ti.dir }

// Locks are the image's PIDs, which the restore takes on this host; an image with a PID
// namespace of its own takes none of the host's.
func (ti *treeImage) Locks() []string {
	if ti.m.OwnPIDNamespace() {
		return nil
	}
	pids := make([]int, len(ti.m.Processes))
	for i, p := range ti.m.Processes {
		pids[i] = p.PID
	}
	return treeLocks(pids)
}
func (ti *treeImage) CRIUPlugins() bool { return true }
func (ti *treeImage) FilePlugins() bool { return true }

func (ti *treeImage) CarriesSemaphores() bool { return true }

func (ti *treeImage) Check() error {
	if criuimg.OwnMounts(image.CRIUPath(ti.dir)) {
		return fmt.Errorf("%w: the image's tree had a mount namespace of its own, which CRIU restores only into a container's root; "+
			"restore it with --container if it was one, or checkpoint the tree again without unsharing its mounts", ErrTreeImage)
	}
	sig, err := criuimg.ParentDeathSignal(image.CRIUPath(ti.dir))
	if err != nil {
		return err
	}
	if sig != 0 {
		return fmt.Errorf("%w: its root, PID %d (%s), asked for signal %d when its parent dies (as unshare --kill-child "+
			"and other launchers set it), and CRIU, its parent in a restore, exits as soon as the tree runs: start the job "+
			"without a parent-death signal on its first process", ErrTreeImage, ti.m.RootPID, ti.rootCommand(), sig)
	}
	if err := CheckHostPIDsFree(ti.dir, ti.m); err != nil {
		return err
	}
	if err := filesPresent(image.CRIUPath(ti.dir), ti.m); err != nil {
		return err
	}
	return checkReopened(ti.m)
}

// CheckHostPIDsFree fails up front, for the image at dir without a PID namespace of its
// own, when one of its PIDs or thread IDs is taken on this host (waitPIDsFree): CRIU gives
// them back as they were, and fails halfway where one is taken.
func CheckHostPIDsFree(dir string, m *image.Manifest) error {
	if m.OwnPIDNamespace() {
		return nil
	}
	tids, err := criuimg.ThreadIDs(image.CRIUPath(dir))
	if err != nil {
		return err
	}
	return waitPIDsFree(m, tids, pidWait)
}

func (ti *treeImage) Restore(ctx context.Context, op *Op, s RestoreSpec) (*Restored, error) {
	// The image's PIDs are this host's only without a PID namespace of its own; with one,
	// the tree is journaled once whole, under the host PIDs it got.
	if !ti.m.OwnPIDNamespace() {
		if err := op.Update(func(rec *txn.Record) { rec.Tree, rec.GPUs = s.Procs() }); err != nil {
			return nil, err
		}
	}
	// What the image's processes hold, read once: the gate checks the restored ones against
	// it, and a rollback knows the tasks CRIU took far by their programs.
	var openedErr error
	ti.opened, openedErr = criuimg.OpenedFiles(s.Checked)
	cut, run := newCutoff(ctx, &s)
	g := &gate{ctx: run, s: s, ownPIDs: ti.m.OwnPIDNamespace(), want: ti.opened, wantErr: openedErr}
	pid, err := ti.e.CRIU.Restore(run, s.RestoreRequest, g)
	forks := g.forks.Stop()
	ti.made, ti.criuStart = g.made, g.forks.criuStart()
	if err != nil {
		// CRIU kills what it made when it fails, but not when it is killed itself (by the
		// cut-off, or by anyone: the OOM killer, an admin): its tasks stayed in its restorer,
		// every signal blocked, holding the image's PIDs for good (crash test). They go.
		KillJournaled(forks)
		ti.kill()
		if reason := cut.done(); reason != nil {
			return nil, fmt.Errorf("%w: CRIU was stopped and the restored processes killed; the image is unchanged", reason)
		}
		HintGrownFile(err, s.Checked, false)
		return nil, err
	}
	stats, err := criuimg.ReadRestoreStats(s.WorkDir)
	if err != nil {
		ti.e.Logger().Warn("CRIU's restore statistics are unreadable", "err", err)
	}
	return &Restored{Root: pid, Host: g.mapped, Stats: stats}, nil
}

func (ti *treeImage) Remove(_ context.Context, cause error) error {
	ti.kill()
	return fmt.Errorf("%w; the restored processes were killed, the image is unchanged", cause)
}

func (ti *treeImage) rootCommand() string {
	if len(ti.m.Processes) == 0 {
		return "?"
	}
	return ti.m.Processes[0].Command
}

// kill kills what the restore made: the processes CRIU had restored when it reached
// post-restore, while they are the processes they were; before that, the tasks at the
// image's PIDs that are still CRIU's forks (in a PID namespace of its own, the host's PIDs
// of them are not known, and CRIU takes them with it).
func (ti *treeImage) kill() {
	switch {
	case len(ti.made) > 0:
		KillJournaled(ti.made)
	case !ti.m.OwnPIDNamespace():
		tree, _ := imageProcs(ti.m, nil)
		killForks(tree, ti.e.CRIU.Path, max(selfStart(), ti.criuStart), ti.opened)
	}
}

// gate holds CRIU at post-restore, with every task restored and none resumed, until the
// image is verified and the memory gpucr restores itself is written; a failure makes CRIU
// kill the tasks. It journals that they are whole as CRIU is about to let them go (PreResume): if gpucr dies
// after this, its guardian finishes the restore instead of killing them.
type gate struct {
	criu.NoNotify
	ctx context.Context // cancelled when the restore is interrupted before its tasks are whole
	s   RestoreSpec
	// ownPIDs: the tree is restored into a PID namespace of its own, where its processes
	// have the image's PIDs and the host gives them others; host maps the ones to the others.
	ownPIDs bool
	root    int // the root's host PID, as CRIU reports it
	forks   *ForkWatch
	// want is what the image's processes held, and wantErr why it could not be read.
	want    map[int]*criuimg.Opened
	wantErr error
	host    map[int]int
	made    []txn.Proc  // the processes restored (the root and its descendants), with their start times
	mapped  map[int]int // the same, image PID -> host PID
}

// Started watches what CRIU makes from the moment it runs.
func (g *gate) Started(pid int) { g.forks = watchForks(pid, "") }

// restored maps the image's PIDs of the processes this restore made to their host PIDs: the
// restored root and what descends from it, none resumed yet.
func (g *gate) restored() (map[int]int, error) {
	if g.ownPIDs {
		return g.host, nil
	}
	tree, err := proctree.Tree(g.root)
	if err != nil {
		return nil, err
	}
	m := make(map[int]int, len(tree))
	for _, p := range tree {
		m[p.PID] = p.PID
	}
	return m, nil
}

func (g *gate) PostRestore(root int32) error {
	g.root = int(root)
	if g.ownPIDs {
		var err error
		if g.host, err = proctree.HostPIDs(g.root); err != nil {
			return err
		}
	}
	// Only the processes this restore made are journaled, filled and ever killed: an image
	// may name any PID, a thread of another process's among them (/proc does not list it,
	// but process_vm_writev and kill take it).
	made, err := g.restored()
	if err != nil {
		return err
	}
	// From here the restore knows what it made: the watch of CRIU's forks, which reads
	// every restored thread's children each millisecond, would only take cores from the fill.
	g.forks.Stop()
	g.mapped = made
	for _, pid := range made {
		if p, err := txn.ProcOf(pid); err == nil {
			g.made = append(g.made, p)
		}
	}
	if err := g.s.Created(made); err != nil {
		return err
	}
	// CRIU reopened every file by its path, as root, following symlinks: a directory on the
	// way that a user swapped since the checkpoint hands the restored process another file.
	// Nothing has run yet; a refusal here has CRIU kill the tasks.
	if g.wantErr != nil {
		return g.wantErr
	}
	want := g.want
	procfs, err := proctree.ProcMounts()
	if err != nil {
		return fmt.Errorf("find where procfs is mounted: %w", err)
	}
	if err := criuimg.CheckReopened("/proc", procfs, want, made); err != nil {
		return err
	}
	if err := checkHeld("/proc", want, made, g.s.Reopened); err != nil {
		return err
	}
	crashpoint.Hit("in " + PhaseCRIURestore)
	if err := g.s.Verified(); err != nil {
		return err
	}
	if err := g.ctx.Err(); err != nil {
		return fmt.Errorf("restore interrupted: %w", err)
	}
	if g.s.Fill != nil {
		if err := g.s.Fill.Renumber(made); err != nil {
			return err
		}
		if err := g.s.Timer.RunCounted(g.ctx, PhaseMemoryFill, g.s.Fill.Fill); err != nil {
			return err
		}
	}
	return nil
}

// PreResume journals that the tasks are whole just before CRIU lets them go. Up to here a
// gpucr that dies leaves a record whose recovery removes them (CRIU, finding no answer,
// lets them go all the same, and they run only until then); after it they run, and the
// guardian finishes the restore. Journaled at post-restore instead, a gpucr killed with its
// CRIU in between left the tasks in CRIU's restorer while recovery resumed their GPUs and
// called the restore done (crash test). An error here fails the restore, which removes the
// tasks (treeImage.Restore).
func (g *gate) PreResume() error {
	if err := g.s.Whole(); err != nil {
		return err
	}
	crashpoint.Hit("resuming")
	return nil
}
