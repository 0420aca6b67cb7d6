package criu

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/internal/hwbreak"
)

// Log file names CRIU writes into the work directory.
const (
	DumpLog    = "dump.log"
	RestoreLog = "restore.log"
)

// DefaultLogLevel keeps errors and warnings: enough to explain a failure without slowing
// a large dump with per-mapping lines. Level 4 logs everything, for debugging.
const DefaultLogLevel = 2

// ghostLimit is the largest deleted-but-open file CRIU copies into the image (its default
// is 1 MiB): NCCL keeps tens of MiB in unlinked /dev/shm files that a job cannot restore without.
const ghostLimit = 1 << 30

// Flags are the CRIU behaviours a user chooses for a checkpoint. An image stores them as
// they were (its manifest embeds them) and its restore uses them, whichever way CRIU is
// driven: over RPC for a process tree, through a container runtime's flags for a container.
type Flags struct {
	ShellJob       bool `json:"shellJob"`       // the tree is attached to a terminal
	TCPEstablished bool `json:"tcpEstablished"` // checkpoint established TCP connections
	ExtUnixSk      bool `json:"extUnixSk"`      // allow unix sockets connected outside the tree
	FileLocks      bool `json:"fileLocks"`      // checkpoint file locks
	// NetworkLock is how CRIU keeps TCP peers quiet while the tree is frozen: "nftables"
	// (gpucr's default: through libnftables, no binary needed), "iptables" (CRIU's own
	// default, needs iptables-restore), or "skip" when every peer is inside the tree.
	NetworkLock string `json:"networkLock,omitempty"`
}

// ForRestore is what a restore of an image dumped with f runs with, the user's restore
// flags u added: what the dump needed the restore needs too, and the network is unlocked
// the way the dump locked it unless the user says otherwise.
func (f Flags) ForRestore(u Flags) Flags {
	out := Flags{
		ShellJob:       f.ShellJob || u.ShellJob,
		TCPEstablished: f.TCPEstablished || u.TCPEstablished,
		ExtUnixSk:      f.ExtUnixSk || u.ExtUnixSk,
		FileLocks:      f.FileLocks || u.FileLocks,
		NetworkLock:    u.NetworkLock,
	}
	if out.NetworkLock == "" {
		out.NetworkLock = f.NetworkLock
	}
	return out
}

// Options are the flags and how gpucr runs CRIU with them, shared by dump and restore.
type Options struct {
	Flags
	LogLevel int // CRIU's log verbosity, 1-4; 0 means DefaultLogLevel
	// PluginDir, when set, is the directory CRIU loads plugins from (CRIU_LIBS_DIR).
	PluginDir string
	// Env holds settings for CRIU's plugins, such as KFD_FW_VER_CHECK=0.
	Env []string
}

// childEnv is what CRIU's process gets on top of gpucr's environment: what this host needs
// of CRIU first, so that a setting of the caller's can override it.
func (o Options) childEnv() []string {
	return append(hwbreak.CRIUEnv(), o.PluginEnv()...)
}

// PluginEnv is what CRIU's environment needs for the plugins: their settings, and where
// they are. A runtime that runs CRIU (runc) passes its own environment on to it.
func (o Options) PluginEnv() []string {
	env := slices.Clip(o.Env)
	if o.PluginDir != "" {
		env = append(env, "CRIU_LIBS_DIR="+o.PluginDir)
	}
	return env
}

// ValidateNetworkLock checks a --network-lock value.
func ValidateNetworkLock(m string) error {
	if _, ok := networkLocks[m]; !ok {
		return fmt.Errorf("unknown network lock %q (want nftables, iptables or skip)", m)
	}
	return nil
}

var networkLocks = map[string]rpc.CriuNetworkLockMethod{
	"":         rpc.CriuNetworkLockMethod_NFTABLES,
	"iptables": rpc.CriuNetworkLockMethod_IPTABLES,
	"nftables": rpc.CriuNetworkLockMethod_NFTABLES,
	"skip":     rpc.CriuNetworkLockMethod_SKIP,
}

// DumpRequest says what to dump and where.
type DumpRequest struct {
	PID          int
	ImagesDir    string // CRIU's image files go here
	WorkDir      string // logs and statistics go here
	LeaveRunning bool
	// PageServerPort, when set, sends the memory pages to a page server on this loopback
	// port instead of into ImagesDir.
	PageServerPort int
	// LinkRemap lets CRIU dump a file held under a path deleted while it has another name
	// through a link it leaves beside the file (link_remap.N), which its restore consumes.
	LinkRemap bool
	Options
}

// RestoreRequest says what to restore.
type RestoreRequest struct {
	ImagesDir string
	WorkDir   string
	Options
}

// Error is a failed CRIU run, with the error lines of its log.
type Error struct {
	Op      string // "dump" or "restore"
	LogPath string
	Lines   []string // CRIU's last error lines
	Err     error
	Hint    string // what to do about Lines[0], where gpucr knows
}

// Error names the cause: gpucr's own failed answer to a notification if that ended the
// run (CRIU's log then holds only what followed), else CRIU's first error line.
func (e *Error) Error() string {
	msg := e.Err.Error()
	var ne *NotifyError
	if errors.As(e.Err, &ne) {
		msg = ne.Script + ": " + ne.Error()
	} else if len(e.Lines) > 0 {
		msg = e.Lines[0]
		if e.Hint != "" {
			msg += ": " + e.Hint
		}
	}
	if e.LogPath == "" {
		return fmt.Sprintf("criu %s failed: %s (CRIU wrote no log)", e.Op, msg)
	}
	return fmt.Sprintf("criu %s failed: %s (log: %s)", e.Op, msg, e.LogPath)
}

func (e *Error) Unwrap() error { return e.Err }

// GrownFile matches CRIU's refusal to restore an open file whose size is not the one it
// recorded: the file's name (from CRIU's root), its size, and the size recorded.
var GrownFile = regexp.MustCompile(`File (.+) has bad size (\d+) \(expect (\d+)\)`)

// Dump checkpoints the tree rooted at r.PID. CRIU resumes the tree itself when the dump
// fails, so the workload keeps running; the caller owns everything else.
func (d *Driver) Dump(ctx context.Context, r DumpRequest, n Notify) error {
	opts := r.rpc()
	opts.Pid = proto.Int32(int32(r.PID))
	opts.LeaveRunning = proto.Bool(r.LeaveRunning)
	opts.LinkRemap = proto.Bool(r.LinkRemap)
	opts.LogFile = proto.String(DumpLog)
	if r.PageServerPort != 0 {
		opts.Ps = &rpc.CriuPageServerInfo{Address: proto.String("127.0.0.1"), Port: proto.Int32(int32(r.PageServerPort))}
	}
	_, err := d.run(context.WithoutCancel(ctx), rpc.CriuReqType_DUMP, r.ImagesDir, r.WorkDir, opts, r.childEnv(), n)
	return err
}

// Restore restores the tree in r.ImagesDir, detached: when CRIU exits the tree is
// re-parented to the init process (or the caller's subreaper). It returns the root PID.
// Cancelling ctx kills CRIU wherever it is, stuck or not; the tasks it had created are the
// caller's to kill. (A dump is never cut short this way: CRIU resumes the tree itself when
// the dump fails, which a killed CRIU could not.)
func (d *Driver) Restore(ctx context.Context, r RestoreRequest, n Notify) (int, error) {
	opts := r.rpc()
	opts.LogFile = proto.String(RestoreLog)
	resp, err := d.run(ctx, rpc.CriuReqType_RESTORE, r.ImagesDir, r.WorkDir, opts, r.childEnv(), n)
	if err != nil {
		return 0, err
	}
	pid := int(resp.GetRestore().GetPid())
	if pid <= 0 {
		return 0, fmt.Errorf("criu restore reported no root pid")
	}
	return pid, nil
}

func (o Options) rpc() *rpc.CriuOpts {
	if o.LogLevel == 0 {
		o.LogLevel = DefaultLogLevel
	}
	return &rpc.CriuOpts{
		ShellJob:       proto.Bool(o.ShellJob),
		TcpEstablished: proto.Bool(o.TCPEstablished),
		ExtUnixSk:      proto.Bool(o.ExtUnixSk),
		FileLocks:      proto.Bool(o.FileLocks),
		LogLevel:       proto.Int32(int32(o.LogLevel)),
		NetworkLock:    networkLocks[o.NetworkLock].Enum(),
		GhostLimit:     proto.Uint32(ghostLimit),
	}
}

// run opens the directories CRIU works in, starts criu swrk with env added to its
// environment, sends it the request typ with opts, and answers its notifications through
// n (none are asked for when n is nil). CRIU reads the directories through our
// descriptors. If ctx is cancelled before CRIU answers, CRIU is killed: its socket has no
// deadline, and only CRIU's death ends the wait when CRIU hangs.
func (d *Driver) run(ctx context.Context, typ rpc.CriuReqType, imagesDir, workDir string, opts *rpc.CriuOpts, env []string, n Notify) (*rpc.CriuResp, error) {
	op := strings.ToLower(typ.String())
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("criu %s: %w", op, err)
	}
	img, err := os.Open(imagesDir)
	if err != nil {
		return nil, fmt.Errorf("criu %s: open images dir: %w", op, err)
	}
	defer img.Close()
	work, err := os.Open(workDir)
	if err != nil {
		return nil, fmt.Errorf("criu %s: open work dir: %w", op, err)
	}
	defer work.Close()
	opts.ImagesDirFd = proto.Int32(int32(img.Fd()))
	opts.WorkDirFd = proto.Int32(int32(work.Fd()))
	opts.NotifyScripts = proto.Bool(n != nil)

	// CRIU is kept from signals meant for gpucr's process group (startSwrk): a restore's
	// CRIU killed with the group after the tasks were let through the gate left them in
	// its restorer for good, every signal blocked, holding the image's PIDs (hostile test).
	// A shell job's restore stays in the group: CRIU gives the restored job the terminal,
	// which a process of a background group may not do.
	shellRestore := typ == rpc.CriuReqType_RESTORE && opts.GetShellJob()
	s, err := startSwrk(d.Path, env, !shellRestore, shellRestore)
	if err != nil {
		return nil, fmt.Errorf("criu %s: start %s: %w", op, d.Path, err)
	}
	if sn, ok := n.(StartedNotify); ok {
		sn.Started(s.cmd.Process.Pid)
	}
	killed := make(chan bool, 1)
	stop := context.AfterFunc(ctx, func() { killed <- s.kill() == nil })
	resp, runErr := s.call(&rpc.CriuReq{Type: typ.Enum(), Opts: opts}, n)
	if !stop() && <-killed {
		runErr = fmt.Errorf("%w (CRIU was killed)", ctx.Err())
	}
	if closeErr := s.close(); runErr == nil {
		runErr = closeErr
	}
	if runErr != nil {
		logPath := filepath.Join(workDir, opts.GetLogFile())
		return nil, newError(op, logPath, runErr)
	}
	return resp, nil
}

// LogError is err, the failure of a CRIU that another program ran (runc), as an Error that
// quotes the first error line of its log at path.
func LogError(op, path string, err error) *Error {
	return newError(op, path, err)
}

// newError is err, a CRIU run's failure, with the error lines of its log at path and what
// to do about the first where gpucr knows more than CRIU says.
func newError(op, path string, err error) *Error {
	e := &Error{Op: op, LogPath: path, Lines: errorLines(path), Err: err}
	if len(e.Lines) > 0 {
		e.Hint = hintFor(e.Lines[0])
	}
	return e
}

// halfConnection matches CRIU's refusal to dump a unix stream socket connected to one that
// no process of the tree holds, and the peer's name ("(null)" for an unnamed one).
var halfConnection = regexp.MustCompile(`Can't dump half of stream unix connection\. name: .*; peer name: (.*)$`)

// linkRemapTaken matches CRIU's failure to make the link a semaphore held under a deleted
// name is dumped through, its name (link_remap.N) taken: it names the semaphore's temporary
// path, not the file in the way, and a local user's file there stopped checkpoints of jobs
// using multiprocessing (hostile test).
var linkRemapTaken = regexp.MustCompile(`Can't link remap to .*: File exists`)

// hintFor is what to do about CRIU's error line, "" where gpucr knows no more than CRIU:
// a job talking to a supervisor's unix socket was refused with CRIU's "half of stream unix
// connection" alone, which --ext-unix-sk, the option CRIU's other socket errors name,
// does not help (hostile test).
func hintFor(line string) string {
	if linkRemapTaken.MatchString(line) {
		return "a file is in the way of the link CRIU makes beside a semaphore the job holds (link_remap.N in its " +
			"directory, /dev/shm): remove the link_remap files there that no restore is using, and checkpoint again"
	}
	m := halfConnection.FindStringSubmatch(line)
	if m == nil {
		return ""
	}
	peer := "a unix socket"
	if m[1] != "(null)" {
		peer = m[1]
	}
	return "the tree is connected through a unix stream socket to " + peer + ", which a process outside it holds (a supervisor, " +
		"an agent); CRIU cannot checkpoint one end of a connection, --ext-unix-sk or not: checkpoint a tree that holds both ends, " +
		"or have the job connect once it runs"
}

// errorLines returns the first few "Error" lines of a CRIU log: the first names the cause,
// the later ones ("Dumping FAILED") only its consequences.
func errorLines(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var lines, interrupts []string
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64*1024), 1024*1024)
	for s.Scan() {
		l := s.Text()
		switch {
		case strings.Contains(l, "Error") && !harmless(l):
			if lines = append(lines, strings.TrimSpace(l)); len(lines) == 3 {
				return lines
			}
		case strings.Contains(l, "Unable to interrupt task") && len(interrupts) == 0:
			interrupts = append(interrupts, strings.TrimSpace(l))
		}
	}
	if !slices.ContainsFunc(lines, func(l string) bool { return !strings.Contains(l, "ing FAILED") }) {
		// CRIU warns so of every zombie it meets too, and carries on: the warning is the
		// cause only where no error but CRIU's "Dumping FAILED" follows it (review).
		return append(interrupts, lines...)
	}
	return lines
}

// harmless says whether a CRIU error line is one CRIU logs and carries on after, never a
// cause: a failed RLIMIT_NOFILE raise, its probes for iptables binaries (a restore of a
// network namespace looks for each variant; a host without them restores the namespace
// when it had no rules), and nft's complaint as CRIU removes its network lock after a
// failure, which stood in for the cause in the error (hostile test). A task CRIU could not
// interrupt (it died, or a tracer took it) is logged as a warning, and is the cause.
func harmless(line string) bool {
	return strings.Contains(line, "RLIMIT_NOFILE") || iptablesProbe.MatchString(line) ||
		strings.HasPrefix(strings.TrimSpace(line), "Error: Could not process rule")
}

var iptablesProbe = regexp.MustCompile(`ip6?tables(-legacy)?-restore(", \.\.\.\) failed| -V failed)`)

// KernelCheck runs CRIU's own check of the kernel features it needs and returns its verdict.
func (d *Driver) KernelCheck(ctx context.Context) (string, error) {
	env, err := Environ()
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, d.Path, "check")
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	text := strings.TrimSpace(string(out))
	if err != nil {
		return text, fmt.Errorf("criu check: %w: %s", err, lastLine(text))
	}
	return lastLine(text), nil
}

func lastLine(s string) string {
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
