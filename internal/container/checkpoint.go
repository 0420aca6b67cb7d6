package container

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gpucr/gpucr/internal/beneath"
	"github.com/gpucr/gpucr/internal/criu"
	"github.com/gpucr/gpucr/internal/engine"
	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/txn"
)

// InfoName is the file, beside the manifest and checksummed with the image, that says
// which container an image holds and where its bundle was.
const InfoName = "container.json"

// Info describes the checkpointed container.
type Info struct {
	ID     string `json:"id"`
	Bundle string `json:"bundle"`
	// Created is when runc created the container (absent from older images): an exported
	// archive's config.dump says it.
	Created time.Time `json:"created,omitzero"`
}

// ReadInfo reads dir's container description; os.ErrNotExist means dir holds a process
// tree, not a container.
func ReadInfo(dir string) (*Info, error) {
	// Beneath the image, regular and small: a symlink to /dev/zero or a FIFO there made
	// root's gpucr fill its memory or wait for good (hostile test).
	b, err := beneath.ReadFile(dir, InfoName, maxInfo)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", filepath.Join(dir, InfoName), err)
	}
	var i Info
	if err := json.Unmarshal(b, &i); err != nil {
		return nil, fmt.Errorf("read %s: %w", filepath.Join(dir, InfoName), err)
	}
	return &i, nil
}

// maxInfo bounds container.json: a container's ID, bundle and runtime settings.
const maxInfo = 1 << 20

// ErrNotRunning means the container is not running, so there is nothing to checkpoint.
var ErrNotRunning = errors.New("container is not running")

// ErrNoContainer means runc has no container by that ID.
var ErrNoContainer = errors.New("no such container")

// ErrExists means a restore would take the ID of a container runc already has.
var ErrExists = errors.New("a container with that ID exists")

// Containers checkpoints and restores runc containers with the engine's CRIU and GPU
// backends.
type Containers struct {
	Engine *engine.Engine
	Runc   *Runc
	// Gpucr is the gpucr binary CRIU runs to fill memory during a restore; "" is this one.
	Gpucr string
}

// Target is the engine's checkpoint target for runc container id: runc drives CRIU, with
// the container paused, so that it is killed only once the image is committed.
func (c *Containers) Target(id string) engine.Target { return &runcTarget{c: c, id: id} }

type runcTarget struct {
	c      *Containers
	id     string
	state  State
	tree   []proctree.Process
	inside map[int]bool
}

func (t *runcTarget) What() string      { return "container " + t.id }
func (t *runcTarget) CRIUPlugins() bool { return false }

// FilePlugins is true: runc passes its environment, which names the plugin, on to CRIU.
func (t *runcTarget) FilePlugins() bool  { return true }
func (t *runcTarget) RuntimeStdio() bool { return true }

// CarriesSemaphores is false: runc drives CRIU's dump, without link remaps.
func (t *runcTarget) CarriesSemaphores() bool { return false }

func (t *runcTarget) Open(ctx context.Context) ([]proctree.Process, error) {
	if err := t.c.Runc.CheckState(t.id); err != nil {
		return nil, err
	}
	st, err := t.c.Runc.State(ctx, t.id)
	if err != nil && strings.Contains(err.Error(), "does not exist") {
		return nil, fmt.Errorf("%w: %s (%v)", ErrNoContainer, t.id, err)
	}
	if err != nil {
		return nil, err
	}
	if err := checkUnowned(st); err != nil {
		return nil, err
	}
	if st.Status != "running" {
		return nil, fmt.Errorf("%w: %s is %s", ErrNotRunning, t.id, st.Status)
	}
	tree, err := proctree.Tree(st.PID)
	if err != nil {
		return nil, err
	}
	t.state = st
	t.setTree(tree)
	return tree, nil
}

// Locks keep other gpucr operations off the container, under its ID and under each of its
// processes' PIDs (a checkpoint of a process tree inside it would race this one).
func (t *runcTarget) Locks() []string {
	locks := []string{engine.ContainerLock(t.id)}
	for _, p := range t.tree {
		locks = append(locks, engine.PIDLock(p.PID))
	}
	return locks
}

// ImagePID is the container's own number for pid; a process outside the container (its
// init's parent) has none, 0.
func (t *runcTarget) ImagePID(pid int) (int, error) {
	if !t.inside[pid] {
		return 0, nil
	}
	return proctree.InnerPID(pid)
}

// Freeze pauses the container, journaled as paused first (resuming a running container is
// harmless): runc dumps a paused container and leaves it paused. Its resume is part of the
// rollback before the pause: a runc that froze the cgroup and then failed left it paused,
// with nothing to resume it (review). The tree is read again once paused: a shell's
// short-lived children come and go until then.
func (t *runcTarget) Freeze(ctx context.Context, op *engine.Op, undo *engine.Undo) ([]proctree.Process, error) {
	if err := op.Update(func(rec *txn.Record) {
		rec.Container = &txn.Container{ID: t.id, Runtime: t.c.Runc.Command(), Paused: true}
	}); err != nil {
		return nil, err
	}
	undo.OnFail("resume container "+t.id+", it is left paused", func(ctx context.Context) error {
		if err := t.resume(ctx); err != nil {
			return err
		}
		return op.Update(func(r *txn.Record) { r.Container.Paused = false })
	})
	if err := t.c.Runc.Pause(ctx, t.id); err != nil {
		return nil, err
	}
	tree, err := proctree.Tree(t.state.PID)
	if err != nil {
		return nil, err
	}
	t.setTree(tree)
	if err := t.checkWhole(ctx); err != nil {
		return nil, err
	}
	return tree, nil
}

// checkWhole refuses a container whose cgroup holds a process outside its init's tree,
// which CRIU does not dump and the container's removal kills: a process started by runc
// exec -d is a child of runc's on the host, then of the host's init, even inside the
// container's PID namespace, and a checkpoint said it had saved the container while its
// removal killed that process unsaved (hostile test).
func (t *runcTarget) checkWhole(ctx context.Context) error {
	pids, err := t.c.Runc.PIDs(ctx, t.id)
	if err != nil {
		return err
	}
	for _, pid := range pids {
		if t.inside[pid] {
			continue
		}
		what := fmt.Sprintf("PID %d", pid)
		if p, err := proctree.Read(pid); err == nil {
			what = fmt.Sprintf("%s (%s)", what, p.Command)
		}
		return fmt.Errorf("%w: container %s's cgroup holds %s, which is not below its init (PID %d): CRIU would not save it and removing the container would kill it; "+
			"stop it (a runc exec's process), or start it from a process of the container", engine.ErrBadTarget, t.id, what, t.state.PID)
	}
	return nil
}

// resume thaws the container. One runc does not say is paused needs nothing (a pause
// that never froze it, a left-running checkpoint's container resumed before its commit
// failed, one that exited as the checkpoint began): runc refuses to resume it, and the
// rollback said it was left paused.
func (t *runcTarget) resume(ctx context.Context) error {
	err := t.c.Runc.Resume(ctx, t.id)
	if err == nil {
		return nil
	}
	st, serr := t.c.Runc.State(ctx, t.id)
	if serr == nil && st.Status != "paused" || serr != nil && strings.Contains(serr.Error(), "does not exist") {
		return nil
	}
	return fmt.Errorf("runc resume %s: %w", t.id, err)
}

// setTree records the container's processes, by host PID.
func (t *runcTarget) setTree(tree []proctree.Process) {
	t.tree, t.inside = tree, map[int]bool{}
	for _, p := range tree {
		t.inside[p.PID] = true
	}
}

// Dump has runc dump the paused container, which it leaves paused, and then commits. The
// container is frozen from the start: memory may be copied out of it beside runc's dump.
func (t *runcTarget) Dump(ctx context.Context, d criu.DumpRequest, h engine.DumpHooks) error {
	h.Frozen()
	pageServer := ""
	if d.PageServerPort != 0 {
		pageServer = fmt.Sprintf("127.0.0.1:%d", d.PageServerPort)
	}
	if err := t.c.Runc.Checkpoint(ctx, t.id, d.ImagesDir, d.WorkDir, d.Flags, d.PluginEnv(), pageServer); err != nil {
		return err
	}
	return h.Commit()
}

// Describe records which container the image holds and where its bundle was.
func (t *runcTarget) Describe(dir string) error {
	info, err := json.MarshalIndent(Info{ID: t.id, Bundle: t.state.Bundle, Created: t.state.Created}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, InfoName), append(info, '\n'), 0o600); err != nil {
		return fmt.Errorf("write container description: %w", err)
	}
	return nil
}

// Release removes the checkpointed container, or lets it run on.
func (t *runcTarget) Release(ctx context.Context, leaveRunning bool) error {
	if !leaveRunning {
		if err := t.c.Runc.Delete(ctx, t.id); err != nil {
			return fmt.Errorf("removing container %s failed: %w", t.id, err)
		}
		return nil
	}
	if err := t.c.Runc.Resume(ctx, t.id); err != nil {
		return fmt.Errorf("container %s is left paused: %w", t.id, err)
	}
	return nil
}

// innerSnapshots returns snaps with each process numbered as in inner, which holds the
// same processes in the same order as the snapshots do.
func innerSnapshots(snaps []gpu.Snapshot, inner engine.GPUSet) []gpu.Snapshot {
	out := slices.Clone(snaps)
	i := 0
	for s := range out {
		out[s].Processes = slices.Clone(out[s].Processes)
		for p := range out[s].Processes {
			out[s].Processes[p].PID = inner[i].PID
			i++
		}
	}
	return out
}
