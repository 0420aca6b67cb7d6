// Package container checkpoints and restores OCI containers run by runc, with their GPU
// state. runc keeps doing what it does for CRIU (namespaces, mounts, cgroups, stdio);
// gpucr moves the device state around it, and ships the CRIU action script that makes a
// plain `runc checkpoint` / `runc restore` do the same.
package container

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/gpucr/gpucr/internal/criu"
	"github.com/gpucr/gpucr/internal/engine"
	"github.com/gpucr/gpucr/internal/hwbreak"
	"github.com/gpucr/gpucr/internal/interrupt"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/rootonly"
)

// ActionSkipEnv, in CRIU's environment, tells gpucr's CRIU action script that gpucr itself
// moves the GPU state of this checkpoint or restore: with the runc integration installed,
// runc would otherwise run the script under gpucr's own runc calls and lock the GPUs twice.
const ActionSkipEnv = "GPUCR_CRIU_ACTION"

// ErrRuncMissing means no runc binary was found.
var ErrRuncMissing = errors.New("runc not found")

// Runc runs one runc binary with the CRIU gpucr chose.
type Runc struct {
	Path string // the runc binary
	Root string // runc's state directory; "" is runc's default (/run/runc)
	CRIU string // the criu binary runc is to use
}

// FindRunc resolves explicit, else runc on PATH.
func FindRunc(explicit string) (string, error) {
	name := explicit
	if name == "" {
		name = "runc"
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%w (install Debian's runc package or pass --runc): %v", ErrRuncMissing, err)
	}
	return p, nil
}

// State is what `runc state` says about a container.
type State struct {
	ID          string            `json:"id"`
	PID         int               `json:"pid"`
	Status      string            `json:"status"`
	Bundle      string            `json:"bundle"`
	Created     time.Time         `json:"created"`
	Annotations map[string]string `json:"annotations"`
}

// State reads the state of container id.
func (r *Runc) State(ctx context.Context, id string) (State, error) {
	var st State
	out, err := r.run(ctx, "", nil, nil, "state", id)
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return st, fmt.Errorf("runc state %s: %w", id, err)
	}
	return st, nil
}

// PIDs lists the processes of container id's cgroup, as runc ps does: those its pause
// freezes and its forced delete kills.
func (r *Runc) PIDs(ctx context.Context, id string) ([]int, error) {
	out, err := r.run(ctx, "", nil, nil, "ps", "--format", "json", id)
	if err != nil {
		return nil, err
	}
	var pids []int
	if err := json.Unmarshal(out, &pids); err != nil {
		return nil, fmt.Errorf("runc ps %s: %w", id, err)
	}
	return pids, nil
}

// Pause freezes every process of container id through its cgroup.
func (r *Runc) Pause(ctx context.Context, id string) error {
	_, err := r.run(ctx, "", nil, nil, "pause", id)
	return err
}

// Resume thaws a paused container.
func (r *Runc) Resume(ctx context.Context, id string) error {
	_, err := r.run(ctx, "", nil, nil, "resume", id)
	return err
}

// Command is the runc command line (binary and global flags) that acts on this runc's
// containers, for a journal to resume one with.
func (r *Runc) Command() []string {
	c := []string{r.Path}
	if r.Root != "" {
		c = append(c, "--root", r.Root)
	}
	return c
}

// ErrUntrustedRoot is a runc state directory that users other than root could change, run
// as root: a container's state.json names the processes to freeze, dump and kill and the
// cgroups to remove, and a user who could write it had root's gpucr kill a root process of
// their choosing (hostile test).
var ErrUntrustedRoot = errors.New("runc's state directory is not root's alone")

// CheckRoot fails, when gpucr runs as root, unless only root can change runc's state
// directory (Root, or runc's default) and the way to it; one not made yet holds nothing.
// A sticky directory all may write (/tmp) is refused too: there a user planted a copy of a
// victim container's state under a name of their own, and root's gpucr dumped and killed
// the victim (hostile test).
func (r *Runc) CheckRoot() error {
	if os.Geteuid() != 0 {
		return nil
	}
	if err := rootonly.Strict(r.stateRoot()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %v; gpucr acts as root on no container it describes", ErrUntrustedRoot, err)
	}
	return nil
}

// CheckState fails, when gpucr runs as root, unless only root can change container id's
// state directory and its state.json, which name the processes a checkpoint dumps and
// kills. One not there is runc's to report.
func (r *Runc) CheckState(id string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	dir := r.StateDir(id)
	for _, p := range []string{dir, filepath.Join(dir, "state.json")} {
		if err := rootonly.Strict(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: %v; gpucr acts as root on no container it describes", ErrUntrustedRoot, err)
		}
	}
	return nil
}

// StateDir is where this runc keeps container id's state (runc run as root).
func (r *Runc) StateDir(id string) string { return filepath.Join(r.stateRoot(), id) }

// stateRoot is where this runc keeps its containers' state: Root, or runc's default.
func (r *Runc) stateRoot() string {
	if r.Root == "" {
		return "/run/runc"
	}
	return r.Root
}

// Delete kills container id's processes, whatever its state, and removes it.
func (r *Runc) Delete(ctx context.Context, id string) error {
	_, err := r.run(ctx, "", nil, nil, "delete", "--force", id)
	return err
}

// runcFlags are f as runc's flags; runc passes no network lock on (gpucr refuses one for
// a container).
func runcFlags(f criu.Flags) []string {
	var a []string
	for _, o := range []struct {
		on   bool
		flag string
	}{{f.ShellJob, "--shell-job"}, {f.TCPEstablished, "--tcp-established"}, {f.ExtUnixSk, "--ext-unix-sk"}, {f.FileLocks, "--file-locks"}} {
		if o.on {
			a = append(a, o.flag)
		}
	}
	return a
}

// Checkpoint has runc dump container id into imageDir, leaving it as it was (running or
// paused): gpucr decides what becomes of the container once the image is committed. env is
// added to runc's environment, which CRIU inherits; with pageServer (ADDRESS:PORT) CRIU
// sends the memory pages there instead of writing them.
func (r *Runc) Checkpoint(ctx context.Context, id, imageDir, workDir string, f criu.Flags, env []string, pageServer string) error {
	args := append([]string{"checkpoint", "--leave-running", "--image-path", imageDir, "--work-path", workDir}, runcFlags(f)...)
	if pageServer != "" {
		args = append(args, "--page-server", pageServer)
	}
	_, err := r.run(ctx, workDir, env, nil, append(args, id)...)
	if err != nil {
		// A runc killed on its own (the OOM killer, an admin) leaves its CRIU dumping,
		// orphaned, the container's tasks seized: it fails at its next word to runc and
		// then puts the freezer back as it found it, frozen by gpucr's pause. A rollback
		// that resumed the container before that was undone, and the container stayed
		// paused for good (crash test: 3 of 6 kills of runc alone). CRIU holds its log in
		// workDir until it exits.
		waitReleased(workDir, criuEndWait)
	}
	return criuError("dump", workDir, err)
}

// criuEndWait bounds how long a failed checkpoint waits for the CRIU its runc started to
// end, as the guardian waits for CRIU to let go of a tree.
const criuEndWait = 60 * time.Second

// waitReleased waits, at most limit, until no process other than gpucr holds anything in
// dir open.
func waitReleased(dir string, limit time.Duration) {
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if held, err := proctree.Holding(dir); err != nil || len(held) == 0 {
			return
		}
	}
}

// Restore has runc restore imageDir as container id, detached, from bundle, with env added
// to runc's (and so CRIU's) environment; started, when not nil, is given runc's PID once it
// runs.
func (r *Runc) Restore(ctx context.Context, id, bundle, imageDir, workDir string, f criu.Flags, env []string, started func(pid int)) error {
	args := append([]string{"restore", "--detach", "--image-path", imageDir, "--work-path", workDir, "--bundle", bundle}, runcFlags(f)...)
	_, err := r.run(ctx, workDir, env, started, append(args, id)...)
	return criuError("restore", workDir, err)
}

// criuError is err, a failed runc checkpoint or restore, as the failure of its CRIU run op
// where CRIU's log (op.log, in workDir) is there: it quotes the log's first error line,
// and the engine keeps a copy once workDir is removed. runc's own message names only the
// log in workDir, which users found gone.
func criuError(op, workDir string, err error) error {
	log := filepath.Join(workDir, op+".log")
	if err == nil {
		return nil
	}
	if _, serr := os.Stat(log); serr != nil {
		return err
	}
	msg, _, _ := strings.Cut(err.Error(), " log file: ")
	if strings.Contains(msg, "unixpacket") && strings.HasSuffix(msg, ": EOF") {
		err = fmt.Errorf("runc %s: %w", op, errCRIUDied) // runc says only that its socket read EOF
	}
	if errors.Is(err, errCRIUDied) {
		// Its log's errors are those of CRIU's helpers, which saw it go.
		return &criu.Error{Op: op, LogPath: log, Err: err}
	}
	return criu.LogError(op, log, errors.New(msg))
}

// run runs runc with args, env added to its environment, and returns its stdout; started,
// when not nil, is given runc's PID once it runs. Its log goes to a file in logDir ("" is
// TMPDIR), which a long call puts in its journaled work directory: a killed gpucr's
// rollback removes it. Its stdin and stderr are /dev/null: a restored container inherits
// runc's stdio where its own was pipes, and must not hold gpucr's. runc's errors are read
// from its --log file instead.
func (r *Runc) run(ctx context.Context, logDir string, env []string, started func(pid int), args ...string) ([]byte, error) {
	// runc opens its log by name, following symlinks: in a TMPDIR another user can rename
	// in, root's runc created or appended to a file of that user's choosing (review).
	if logDir == "" {
		var err error
		if logDir, err = engine.TempDir(); err != nil {
			return nil, fmt.Errorf("runc log file: %w", err)
		}
	}
	logf, err := os.CreateTemp(logDir, "gpucr-runc-*.log")
	if err != nil {
		return nil, fmt.Errorf("runc log file: %w", err)
	}
	defer logf.Close()
	// Unnamed at once, runc opening it through gpucr's descriptor: a gpucr killed during a
	// call left the named log in TMPDIR, where no recovery looks.
	if err := os.Remove(logf.Name()); err != nil {
		return nil, fmt.Errorf("runc log file: %w", err)
	}
	global := []string{"--log", fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), logf.Fd()), "--log-format", "json"}
	if r.Root != "" {
		global = append(global, "--root", r.Root)
	}
	if r.CRIU != "" {
		global = append(global, "--criu", r.CRIU)
	}
	// Only a restore is cut short when ctx ends (below). Any other runc call runs to its
	// end: a checkpoint's runc SIGKILLed by an interrupt left its CRIU dumping, orphaned,
	// the resume that followed found the container not paused, and CRIU, when done, froze
	// it again for good; a delete cut short left it stopped (hostile test). The engine looks
	// at ctx once runc is done and rolls back from a known state.
	cmd := exec.Command(r.Path, append(global, args...)...)
	// In a process group of its own, as gpucr's CRIU is for a process tree: a kill of
	// gpucr's whole group (timeout -s KILL, a job scheduler) killed runc's CRIU mid-dump
	// too, and now and then the container's init with it (2-3 of 15 runs of
	// TestContainerCheckpointKilledWithItsProcessGroupLosesNoJob; none of 15 since). The
	// guardian waits for CRIU to let go.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if args[0] == "restore" {
		cmd = exec.CommandContext(ctx, r.Path, append(global, args...)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{}
		// An interrupted restore kills what runc started too: runc gives its CRIU no
		// death signal, and a CRIU hung in its restore would outlive runc.
		cmd.Cancel = func() error {
			killTree(cmd.Process.Pid)
			return nil
		}
	}
	if args[0] == "restore" || args[0] == "pause" {
		// runc dies with gpucr, so that a killed gpucr's rollback never races a restore
		// still creating the container, or a pause still freezing it: the guardian's
		// resume found a container not yet frozen running, and the pause then froze it
		// for good, the rollback done (crash test). The signal follows the thread that
		// started runc: it is kept until runc exits.
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
	}
	base, err := criu.Environ() // runc's CRIU reads the configuration files its environment names
	if err != nil {
		return nil, err
	}
	cmd.Env = append(append(append(base, ActionSkipEnv+"=skip"), hwbreak.CRIUEnv()...), env...)
	var out bytes.Buffer
	if args[0] == "state" || args[0] == "ps" {
		cmd.Stdout = &out // neither starts a process that could hold the pipe
	}
	// Started with SIGINT ignored: the Ctrl-C a terminal sends its whole process group
	// must not kill runc halfway either; gpucr alone decides how to stop.
	err = interrupt.StartImmune(cmd.Start)
	if err == nil {
		if started != nil {
			started(cmd.Process.Pid)
		}
		if args[0] != "restore" {
			err = cmd.Wait()
		} else {
			waited, unstuck := make(chan struct{}), make(chan bool, 1)
			go func() { unstuck <- unstick(cmd.Process.Pid, cmd.Process.Kill, waited) }()
			err = cmd.Wait()
			close(waited)
			if <-unstuck {
				return nil, fmt.Errorf("runc restore: %w, and runc waited on it for good: runc was killed", errCRIUDied)
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("runc %s: %s", args[0], runcError(logf, err))
	}
	return out.Bytes(), nil
}

// killTree kills root and every process below it, the deepest first.
func killTree(root int) {
	tree, err := proctree.Tree(root)
	if err != nil {
		return // runc has exited
	}
	for i := len(tree) - 1; i >= 0; i-- {
		_ = syscall.Kill(tree[i].PID, syscall.SIGKILL)
	}
}

// runcError is the last error runc logged, or how it exited when it logged none.
func runcError(log *os.File, exit error) string {
	msg := exit.Error()
	sc := bufio.NewScanner(log)
	for sc.Scan() {
		var l struct{ Level, Msg string }
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.Level == "error" && l.Msg != "" {
			msg = l.Msg
		}
	}
	return strings.Join(strings.Fields(msg), " ")
}
