package container

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/internal/beneath"
	"github.com/gpucr/gpucr/internal/engine"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/rootonly"
	"github.com/gpucr/gpucr/internal/txn"
)

// Image is the engine's restore target for a container image: runc restores it as
// container id (its recorded ID when "") from bundle (the recorded bundle when ""), and
// gpucr's post-restore hook holds its tasks until the engine has verified the image and
// the hook has filled their memory.
func (c *Containers) Image(id, bundle string) engine.RestoreTarget {
	return &runcImage{c: c, id: id, bundle: bundle}
}

type runcImage struct {
	c          *Containers
	id, bundle string
	dir        string
	m          *image.Manifest
}

func (ri *runcImage) Open(_ context.Context, dir string, m *image.Manifest) error {
	ri.dir, ri.m = dir, m
	info, err := ReadInfo(dir)
	if err != nil {
		return fmt.Errorf("%s does not hold a container (restore it without --container): %w", dir, err)
	}
	if ri.id == "" {
		ri.id = info.ID
	}
	if ri.bundle == "" {
		ri.bundle = info.Bundle
	}
	if err := engine.CheckContainerID(ri.id); err != nil {
		return err
	}
	if ri.bundle, err = filepath.Abs(ri.bundle); err != nil { // as runc's state names it
		return err
	}
	return checkBundle(ri.bundle)
}

// checkBundle refuses, to gpucr running as root, a bundle others could change: runc runs
// the hooks of its config.json as root, and the bundle is named by the image, which anyone
// may have made.
func checkBundle(bundle string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	err := rootonly.Walk(bundle)
	if err == nil {
		var fi os.FileInfo
		config := filepath.Join(bundle, "config.json")
		if fi, err = os.Lstat(config); err == nil {
			err = rootonly.Mode(config, fi)
		}
	}
	if err != nil {
		return fmt.Errorf("bundle %s: %w: runc runs its config.json's hooks as root; restore from a bundle only root can change (--bundle)", bundle, err)
	}
	return nil
}

func (ri *runcImage) What() string      { return "container " + ri.id }
func (ri *runcImage) Locks() []string   { return []string{engine.ContainerLock(ri.id)} }
func (ri *runcImage) CRIUPlugins() bool { return false }

// FilePlugins is true: runc passes its environment, which names the plugin, on to CRIU.
func (ri *runcImage) FilePlugins() bool { return true }

// CarriesSemaphores is false: a container checkpoint records none, and a crafted image's
// would be made in the host's /dev/shm, not the container's.
func (ri *runcImage) CarriesSemaphores() bool { return false }

// Check refuses an ID runc already knows: the restore would fail, and its rollback must
// never remove a container it did not create. It refuses too, as for a process tree, an
// image of a container in the host's PID namespace whose PIDs are taken: CRIU fails to give
// them back, and runc's cleanup of a container without a PID namespace of its own kills
// every process in its cgroup, which a container from the same bundle shares (a hostile
// test's restore under --new-id of a container left running killed that container).
func (ri *runcImage) Check() error {
	if st, err := ri.c.Runc.State(context.Background(), ri.id); err == nil {
		return fmt.Errorf("%w: container %s exists (%s); remove it or restore with --new-id", ErrExists, ri.id, st.Status)
	}
	host, err := inHostPIDNamespace(ri.bundle)
	if err != nil || !host {
		return err
	}
	return engine.CheckHostPIDsFree(ri.dir, ri.m)
}

// inHostPIDNamespace says whether bundle's spec leaves its container in the host's PID
// namespace, where the image's PIDs are the host's: one that joins another container's
// (a namespace path) numbers them as that one does, and a host process of the same number
// is in no restore's way (a hostile test's was refused for a kernel thread's).
func inHostPIDNamespace(bundle string) (bool, error) {
	b, err := ReadSpec(bundle)
	if err != nil {
		return false, fmt.Errorf("read the bundle's spec: %w", err)
	}
	var spec struct {
		Linux struct {
			Namespaces []struct{ Type string } `json:"namespaces"`
		} `json:"linux"`
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		return false, fmt.Errorf("read the bundle's spec %s: %w", filepath.Join(bundle, "config.json"), err)
	}
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type == "pid" {
			return false, nil
		}
	}
	return true, nil
}

// ReadSpec reads the OCI spec in bundle, which may be a user's, its container gone by now:
// beneath the bundle, regular and bounded, and, to gpucr running as root, only where no
// symlink of a user's leads to the bundle. A config.json its owner replaced with a FIFO
// held root's gpucr in open(2) for good, deaf to SIGINT and SIGTERM; a symlink in its place,
// or a bundle path its owner pointed elsewhere (at /root/.docker, say), had root's export
// carry a root-only JSON file (hostile tests).
func ReadSpec(bundle string) ([]byte, error) {
	if os.Geteuid() != 0 {
		return beneath.ReadFile(bundle, "config.json", maxSpec)
	}
	abs, err := filepath.Abs(bundle)
	if err != nil {
		return nil, fmt.Errorf("bundle %s: %w", bundle, err)
	}
	// Checked and opened in one walk: the owner may swap the bundle's path for a symlink of
	// theirs and back between a check and an open by name (review).
	fd, err := rootonly.OpenDir(abs)
	if err != nil {
		return nil, fmt.Errorf("bundle %s: %w", bundle, err)
	}
	defer unix.Close(fd)
	return beneath.ReadFileAt(fd, bundle, "config.json", maxSpec)
}

// maxSpec bounds a bundle's OCI spec: one with a seccomp profile and many mounts is some
// tens of KiB.
const maxSpec = 16 << 20

func (ri *runcImage) Restore(ctx context.Context, op *engine.Op, s engine.RestoreSpec) (*engine.Restored, error) {
	// Once more, now: a container made under the ID since Check is another's, never this
	// restore's to remove.
	if _, err := os.Lstat(ri.c.Runc.StateDir(ri.id)); err == nil {
		return nil, fmt.Errorf("%w: container %s was created meanwhile; restore with --new-id", ErrExists, ri.id)
	}
	self := ri.c.Gpucr
	if self == "" {
		var err error
		if self, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("find gpucr's own binary: %w", err)
		}
	}
	owner, err := txn.ProcOf(os.Getpid())
	if err != nil {
		return nil, err
	}
	env, err := postRestoreHook(s.WorkDir, self, owner)
	if err != nil {
		return nil, err
	}
	env = append(env, s.PluginEnv()...)
	// The hook holds the tasks while this process verifies and fills them, as runc and
	// CRIU restore.
	stop := make(chan struct{})
	type held struct {
		took    time.Duration
		filled  bool
		refused error // a verdict that could not be given
	}
	heldc := make(chan held, 1)
	// What runc's CRIU makes is watched until the container's tasks are all there (the hook
	// has reached post-restore): runc's CRIU kills what it made when it fails, but not when
	// it is killed itself, and its tasks were left in its restorer, or running outside any
	// container (crash test).
	var forks atomic.Pointer[engine.ForkWatch]
	go func() {
		took, filled, refused := holdTasks(ctx, s, stop, func() { forks.Load().Stop() })
		heldc <- held{took, filled, refused}
	}()
	if err := op.Update(func(rec *txn.Record) {
		rec.Container = &txn.Container{ID: ri.id, Runtime: ri.c.Runc.Command(), StateDir: ri.c.Runc.StateDir(ri.id),
			Bundle: ri.bundle, Since: time.Now()}
	}); err != nil {
		return nil, err
	}
	err = ri.c.Runc.Restore(ctx, ri.id, ri.bundle, s.ImagesDir, s.WorkDir, s.Flags, env,
		func(runc int) { forks.Store(engine.WatchCRIUForks(runc)) })
	close(stop)
	h := <-heldc
	made := forks.Load().Stop()
	if err != nil {
		engine.KillJournaled(made)
		engine.HintGrownFile(err, s.Checked, true)
		if ctx.Err() != nil {
			err = errors.New("restore interrupted: runc and its CRIU were stopped")
		} else if h.refused != nil {
			err = fmt.Errorf("%w: %v", err, h.refused)
		} else if why := hookFailure(s.WorkDir); why != "" {
			err = fmt.Errorf("%w: %s", err, why) // runc only says that CRIU's script failed
		} else if strings.Contains(err.Error(), "already exists") {
			// Another made the container under this ID first: it is theirs, not removed.
			return nil, fmt.Errorf("%w: %v; restore with --new-id", ErrExists, err)
		}
		return nil, ri.Remove(context.WithoutCancel(ctx), err)
	}
	// From here on a restored container exists: it must come back whole or go.
	gctx := context.WithoutCancel(ctx)
	if !h.filled || !hookRan(s.WorkDir) {
		return nil, ri.Remove(gctx, errors.New("CRIU did not run gpucr's post-restore hook (its CRIU_CONFIG_FILE was not read), so the container's memory is unverified"))
	}
	st, err := ri.c.Runc.State(gctx, ri.id)
	if err != nil {
		return nil, ri.Remove(gctx, err)
	}
	host, err := proctree.HostPIDs(st.PID)
	if err != nil {
		return nil, ri.Remove(gctx, err)
	}
	if err := s.Created(host); err != nil {
		return nil, ri.Remove(gctx, err)
	}
	if err := s.Whole(); err != nil {
		return nil, ri.Remove(gctx, err)
	}
	return &engine.Restored{Root: st.PID, Host: host, Filled: h.took, FS: fmt.Sprintf("/proc/%d/root", st.PID)}, nil
}

// Remove deletes the half-restored container after cause.
func (ri *runcImage) Remove(ctx context.Context, cause error) error {
	c := &txn.Container{ID: ri.id, Runtime: ri.c.Runc.Command(), StateDir: ri.c.Runc.StateDir(ri.id)}
	if _, err := os.Stat(c.StateDir); err != nil {
		return cause // runc created nothing
	}
	if err := engine.RemoveContainer(ctx, c); err != nil {
		return fmt.Errorf("%w; removing the restored container %s also failed: %v", cause, ri.id, err)
	}
	return fmt.Errorf("%w; the restored container %s was removed, the image is unchanged", cause, ri.id)
}
