package container

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/rootonly"
	"github.com/gpucr/gpucr/internal/txn"
)

// Where the integration goes by default. runc hands CRIU /etc/criu/runc.conf (unless a
// container's org.criu.config annotation names another file), and so does crun 1.26 and
// newer with CRIU 4.2's libcriu, which reads /etc/criu/crun.conf instead when that exists:
// every runc and crun user, and podman, containerd and CRI-O through them, picks the
// action script up.
const (
	DefaultRuncConfig = "/etc/criu/runc.conf"
	DefaultCrunConfig = "/etc/criu/crun.conf"
	DefaultScript     = "/usr/local/libexec/gpucr/criu-action"
	DefaultActionLog  = "/var/log/gpucr/criu-action.log"
)

// StateDir holds what the action script passes from one step to a later one, and the
// script's record of which steps of which CRIU it already ran.
const StateDir = "/run/gpucr/criu-action"

// Integration is the CRIU integration's files: CRIU's configuration files for runc and
// crun, the action script they name, the copy of gpucr the script runs, and its log.
type Integration struct {
	Config     string // CRIU configuration file runc (and crun without CrunConfig) passes to CRIU
	CrunConfig string // crun's own, used only when it exists; "" leaves it alone
	Script     string // the action script; gpucr's copy goes beside it
	Log        string // where the action script logs each step
	StateDir   string // what passes between steps; "" is StateDir
	Gpucr      string // the gpucr binary to install a copy of
}

// Binary is the copy of gpucr the action script runs, as root, where a container has
// GPU state.
func (in Integration) Binary() string { return filepath.Join(filepath.Dir(in.Script), "gpucr") }

// Install copies gpucr beside the action script, writes the script and adds it to the
// configuration files, keeping their other lines. Each is replaced whole by rename: CRIU
// never reads half. The copy and the script live in a directory only root can change, so
// neither a user nor a moved or rebuilt binary changes what runs; the script checks that
// again before each run. crun's file gets the line only if it exists: without it crun reads
// runc's, and creating it would take runc's other settings away from crun.
func (in Integration) Install() error {
	for _, p := range []string{in.Config, in.Script, in.Log, in.Gpucr} {
		if !filepath.IsAbs(p) {
			return fmt.Errorf("%q is not an absolute path: CRIU runs the script from its own directory", p)
		}
	}
	// CRIU refuses a whole configuration file it cannot parse: a script path with a space
	// in runc.conf stopped every runc checkpoint and restore of the host (hostile test).
	if err := checkCRIUConfigPath(in.Script); err != nil {
		return fmt.Errorf("refusing to install the CRIU integration: %w", err)
	}
	dir := filepath.Dir(in.Script)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	if err := rootonly.Walk(dir); err != nil {
		return fmt.Errorf("refusing to install the CRIU integration into %s: %w", dir, err)
	}
	bin, err := os.ReadFile(in.Gpucr)
	if err != nil {
		return fmt.Errorf("copy gpucr: %w", err)
	}
	if err := writeAtomic(in.Binary(), bin, 0o755); err != nil {
		return err
	}
	if err := writeAtomic(in.Script, []byte(actionScript(in.Binary(), in.Log, in.stateDir())), 0o755); err != nil {
		return err
	}
	for _, conf := range in.Configs() {
		lines, _, err := in.otherLines(conf)
		if err != nil {
			return err
		}
		lines = append(lines, "action-script "+in.Script)
		if err := writeAtomic(conf, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			return err
		}
	}
	recorded, err := in.recorded()
	if err != nil {
		return err
	}
	for _, conf := range in.Configs() {
		if !slices.Contains(recorded, conf) {
			recorded = append(recorded, conf)
		}
	}
	return in.record(recorded)
}

// checkCRIUConfigPath refuses a path that a line of a CRIU configuration file cannot name.
// CRIU takes an unquoted value only without a space (a line with one is an error that stops
// CRIU, and runc with it, before its first step), cuts any value at a '#', and reads quotes
// and backslashes as its own: a TMPDIR with a space had every container restore fail with
// runc's "CRIU version check failed" and nothing more (hostile test). Its spaces are C's,
// ASCII only: a path with a no-break space is CRIU's to take.
func checkCRIUConfigPath(p string) error {
	if i := strings.IndexAny(p, criuConfigSpecial); i >= 0 {
		return fmt.Errorf("%q cannot be named in CRIU's configuration file: CRIU takes no %q in a value there", p, p[i:i+1])
	}
	return nil
}

// criuConfigSpecial are the bytes a value in a CRIU configuration file cannot hold as they
// are: C's white space, and the comment, quote and escape characters.
const criuConfigSpecial = " \t\n\v\f\r#\"\\"

// recordPath lists, beside the script, every configuration file an install put it into:
// another install's --config may name the same script, and removing it through one must
// leave it to the others.
func (in Integration) recordPath() string { return in.Script + ".configs" }

// recorded is the configuration files the record lists; none where there is no record.
func (in Integration) recorded() ([]string, error) {
	b, err := os.ReadFile(in.recordPath())
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", in.recordPath(), err)
	}
	return strings.Fields(string(b)), nil
}

func (in Integration) record(confs []string) error {
	return writeAtomic(in.recordPath(), []byte(strings.Join(confs, "\n")+"\n"), 0o644)
}

// Configs are the configuration files the script goes into: runc's, and crun's where it
// exists.
func (in Integration) Configs() []string {
	out := []string{in.Config}
	if in.CrunConfig != "" && in.CrunConfig != in.Config {
		if _, err := os.Stat(in.CrunConfig); err == nil {
			out = append(out, in.CrunConfig)
		}
	}
	return out
}

// CrunReadsRunc says whether crun will read runc's configuration file, crun's own being
// absent.
func (in Integration) CrunReadsRunc() bool { return len(in.Configs()) == 1 }

// scriptHeader begins every action script Install writes.
const scriptHeader = "#!/bin/sh\n# Written by gpucr install-criu-integration"

// actionScript is CRIU's action script. It decides in the shell, at the cost of a few
// builtins, whether the step has GPU work — a process of the dumped tree holds a GPU
// device open, the image being restored has gpucr's GPU record, or pre-restore kept it
// for post-resume — and starts gpucr only then, once per step of one CRIU: CRIU runs each
// script of an RPC configuration file twice a step, and the second run repeats the first's
// exit status. Before starting bin it checks that bin and every directory above it belong
// to root and that no one else can write them (a root-owned sticky directory, like /tmp,
// cannot have root's entries replaced).
func actionScript(bin, log, state string) string {
	return fmt.Sprintf(scriptHeader+`. CRIU runs this at each step of a dump or
# restore; it starts gpucr, which moves the GPU state, only where there is some.
bin=%s
log=%s
state=%s
locks=%s
[ "$%s" = skip ] && exit 0
# What it makes is root's alone, whatever umask runc or its caller ran with: under umask 0
# the state directory's parents came out writable by all, and another user had root write
# over a file of their choosing through it (hostile test).
umask 077
# This CRIU is its PID and start time: what it keeps in $state is named by both, so that
# nothing a CRIU left is ever taken for a later one's at the same PID.
read -r s < /proc/$PPID/stat || exit 1
set -- ${s##*") "}
criu=$PPID.${20}
# forget drops this CRIU's record of the steps it ran, once its last step is over.
forget() {
	for m in "$state/$criu".*; do
		[ -e "$m" ] && rm -f "$state/$criu".*
		break
	done
}
# A step this CRIU ran already (CRIU runs the script twice a step) repeats its status, before
# anything else is looked at: after pre-dump's gpucr the driver has closed the GPU
# processes' device files, and the second run must not take the tree for one without GPU.
ran=$state/$criu.$CRTOOLS_SCRIPT_ACTION
if [ -e "$ran" ]; then
	read -r rc < "$ran"
	[ "$CRTOOLS_SCRIPT_ACTION" = post-resume ] && forget
	exit "${rc:-1}"
fi
case $CRTOOLS_SCRIPT_ACTION in
pre-dump)
	fds= pids=$CRTOOLS_INIT_PID tree=
	while [ -n "$pids" ]; do
		next=
		for p in $pids; do
			tree="$tree $p"
			fds="$fds /proc/$p/fd"
			for c in /proc/$p/task/*/children; do
				k=
				read -r k 2>/dev/null < "$c"
				next="$next $k"
			done
		done
		pids=$next
	done
	# A gpucr operation's lock on a process of the tree: gpucr looks at it, and refuses the
	# dump while it is held (an operation that has checkpointed the GPUs holds no device
	# file of theirs any more).
	held=
	for p in $tree; do
		[ -e "$locks/pid-$p.lock" ] && { held=1; break; }
	done
	# No GPU: nothing to do but drop an earlier dump's record from a reused image directory.
	[ -n "$held" ] || { [ -n "$fds" ] && [ -n "$(find $fds -maxdepth 1 \( -lname '/dev/nvidia*' -o -lname /dev/kfd -o -lname '/dev/dri/renderD*' \) -print -quit 2>/dev/null)" ]; } || {
		rm -f "$CRTOOLS_IMAGE_DIR/%s"
		exit 0
	}
	;;
pre-restore)
	[ -e "$CRTOOLS_IMAGE_DIR/%s" ] || exit 0
	;;
post-resume)
	[ -e "$state/restore-$criu.json" ] || { forget; exit 0; }
	;;
post-dump)
	forget
	exit 0
	;;
*)
	exit 0
	;;
esac
# rootonly PATH: PATH and every directory above it, as named and as its links resolve, are
# root's and writable by no one else (a root-owned sticky directory excepted above PATH);
# a link on the way must be root's (/usr/local is one on some distributions).
rootonly() {
	for p in "$1" "$(readlink -f -- "$1")"; do
		q=$p
		while :; do
			s=$(stat -c '%%u %%a %%F' -- "$q") || return 1
			u=${s%%%% *}; r=${s#* }; m=${r%%%% *}; t=${r#* }
			if [ "$u" != 0 ] || { [ "$t" != "symbolic link" ] && [ $((0$m & 18)) -ne 0 ] && { [ "$q" = "$p" ] || [ $((0$m & 512)) -eq 0 ]; }; }; then
				echo "Error (gpucr criu-action): refusing to run $bin: $q is not root's alone (owner $u, mode $m)" >&2
				return 1
			fi
			[ "$q" = / ] && break
			q=$(dirname -- "$q")
		done
	done
}
rootonly "$bin" || exit 1
mkdir -p -m 700 "$state" || exit 1
# gpucr keeps what it locked there, and the marks below are written by name.
rootonly "$state" || exit 1
# Marked before gpucr starts, not only once it is done: a second run after a first that
# did not finish fails the step instead of starting gpucr again.
: > "$ran" || exit 1
"$bin" criu-action --log "$log" --state-dir "$state" --criu-pid "$PPID"
rc=$?
echo "$rc" > "$ran"
exit "$rc"
`, shellQuote(bin), shellQuote(log), shellQuote(state), shellQuote(filepath.Join(txn.DefaultRoot, "locks")), ActionSkipEnv, RecordName, RecordName)
}

// Removal is what Remove deleted, and what it kept because another install still uses it.
type Removal struct {
	Removed []string `json:"removed"`        // the files deleted
	Kept    []string `json:"kept,omitempty"` // each file kept, and what still uses it
}

// Remove takes the action script out of the configuration files, removing runc's if
// nothing else is left in it (Install may have created it; crun's it never creates), then
// deletes the script and gpucr's copy once no CRIU that may have read the configuration
// before runs: one removed under a CRIU that named it leaves a restore running with its
// GPU state never restored (post-resume does not run), as a rolling update's removal could.
// If one is still running after removeWait, the script is kept for it and Remove fails;
// running it again finishes the removal. The script is kept while another configuration
// file an install recorded still names it, and gpucr's copy while another installed
// script beside it runs it: deleted, their CRIUs failed every GPU step.
func (in Integration) Remove() (*Removal, error) {
	// The wait looks for the node's CRIUs in /proc: checked before anything changes.
	if host, err := proctree.InHostPIDNamespace(); err != nil {
		return nil, err
	} else if !host {
		return nil, errors.New("gpucr runs in a PID namespace of its own and cannot see the CRIUs that may be using the script: run --remove in the host's PID namespace (hostPID: true in a pod); nothing was removed")
	}
	// "removed": [], not null, in --json. A configuration file left empty is deleted, and
	// said to be: the list named only the script and gpucr's copy (documentation walk).
	r := &Removal{Removed: []string{}}
	for _, conf := range in.Configs() {
		lines, _, err := in.otherLines(conf)
		if err != nil {
			return nil, err
		}
		if len(lines) == 0 && conf == in.Config {
			if err = os.Remove(conf); err == nil {
				r.Removed = append(r.Removed, conf)
			}
		} else {
			err = writeAtomic(conf, []byte(strings.Join(lines, "\n")+"\n"), 0o644)
		}
		if err != nil && !os.IsNotExist(err) {
			return nil, fmt.Errorf("update %s: %w", conf, err)
		}
	}
	recorded, err := in.recorded()
	if err != nil {
		return nil, err
	}
	var naming []string
	for _, conf := range recorded {
		if _, names, err := in.otherLines(conf); err != nil {
			return nil, err
		} else if names {
			naming = append(naming, conf)
		}
	}
	if len(naming) > 0 {
		if err := in.record(naming); err != nil {
			return nil, err
		}
		r.Kept = append(r.Kept, fmt.Sprintf("%s and %s: still named by %s", in.Script, in.Binary(), strings.Join(naming, ", ")))
		return r, nil
	}
	// Listed after the configuration changed: a CRIU started later reads it without the script.
	crius, err := runningCRIUs()
	if err != nil {
		return nil, err
	}
	if pid := waitGone(crius, removeWait); pid != 0 {
		return nil, fmt.Errorf("CRIU's configuration no longer names %s, but CRIU (PID %d), which may have read it before, is still running: the script is kept for it; run again once it is done", in.Script, pid)
	}
	remove := []string{in.Script, in.recordPath()}
	users, err := in.otherScripts()
	if err != nil {
		return nil, err
	}
	if len(users) > 0 {
		r.Kept = append(r.Kept, fmt.Sprintf("%s: still run by %s", in.Binary(), strings.Join(users, ", ")))
	} else {
		remove = append(remove, in.Binary())
	}
	for _, p := range remove {
		err := os.Remove(p)
		if err == nil && p != in.recordPath() {
			r.Removed = append(r.Removed, p)
		}
		if err != nil && !os.IsNotExist(err) {
			return nil, fmt.Errorf("remove %s: %w", p, err)
		}
	}
	return r, nil
}

// otherScripts lists the action scripts beside this one that run the same copy of gpucr:
// an install with another --script into the same directory.
func (in Integration) otherScripts() ([]string, error) {
	dir := filepath.Dir(in.Script)
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("read %s: %w", dir, err)
	}
	runs := "\nbin=" + shellQuote(in.Binary()) + "\n"
	var out []string
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if p == in.Script || !e.Type().IsRegular() {
			continue
		}
		// The script names its binary in its first lines; gpucr's copy is read no further.
		head := make([]byte, 1024)
		f, err := os.Open(p)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
		n, _ := io.ReadFull(f, head)
		f.Close()
		if strings.HasPrefix(string(head[:n]), scriptHeader) && strings.Contains(string(head[:n]), runs) {
			out = append(out, p)
		}
	}
	return out, nil
}

// stateDir is where the script keeps what passes between steps.
func (in Integration) stateDir() string {
	if in.StateDir == "" {
		return StateDir
	}
	return in.StateDir
}

// removeWait is how long Remove waits for the dumps and restores under way to end. (A
// variable: tests lower it.)
var removeWait = 2 * time.Minute

// criuCommand is CRIU's process name. The tasks of a restore are CRIU's forks, named so
// until CRIU's restorer gives them their own names back, before they run.
const criuCommand = "criu"

// runningCRIUs lists the CRIU processes that run now, runc's and crun's `criu swrk` among
// them: swrk reads a configuration file when a request comes, so any of them may yet read
// the one it names. A page server or lazy-pages daemon is left out: it runs only the
// status-ready script, once, when it starts, and may run for long.
func runningCRIUs() ([]proctree.Process, error) {
	all, err := proctree.All()
	if err != nil {
		return nil, err
	}
	var out []proctree.Process
	for _, p := range all {
		if p.Command != criuCommand || p.Zombie || !ownedByRoot(p.PID) {
			continue // another user's "criu" reads no root configuration: one held --remove for minutes (hostile test)
		}
		if args, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.PID)); isDaemon(args) {
			continue
		}
		out = append(out, p)
	}
	return out, nil
}

// ownedByRoot says whether pid runs as root: the CRIU runc and crun start does.
func ownedByRoot(pid int) bool {
	var st syscall.Stat_t
	return syscall.Stat(fmt.Sprintf("/proc/%d", pid), &st) == nil && st.Uid == 0
}

// isDaemon says whether a CRIU's NUL-separated command line runs a page server or lazy-pages
// daemon. CRIU takes options before its command too ("criu -v4 page-server"), so any word
// of the line counts, unless a command that runs action scripts is there as well.
func isDaemon(cmdline []byte) bool {
	words := strings.Split(string(cmdline), "\x00")
	if len(words) < 2 {
		return false
	}
	words = words[1:]
	for _, w := range []string{"dump", "pre-dump", "restore", "swrk", "service"} {
		if slices.Contains(words, w) {
			return false
		}
	}
	return slices.Contains(words, "page-server") || slices.Contains(words, "lazy-pages")
}

// waitGone waits, at most limit, until none of crius is still a running CRIU, and returns
// one that still is (0: none).
func waitGone(crius []proctree.Process, limit time.Duration) int {
	deadline := time.Now().Add(limit)
	for {
		running := 0
		for _, c := range crius {
			if p, err := proctree.Read(c.PID); err == nil && p.Start == c.Start && !p.Zombie && p.Command == criuCommand {
				running = c.PID
				break
			}
		}
		if running == 0 || time.Now().After(deadline) {
			return running
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// otherLines is the configuration file conf without the lines that name this script, and
// whether it had one.
func (in Integration) otherLines(conf string) (other []string, named bool, err error) {
	b, err := os.ReadFile(conf)
	if os.IsNotExist(err) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("read %s: %w", conf, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(strings.ReplaceAll(sc.Text(), "=", " "))
		if len(f) == 2 && strings.TrimLeft(f[0], "-") == "action-script" && f[1] == in.Script {
			named = true
			continue
		}
		other = append(other, sc.Text())
	}
	return other, named, nil
}

func writeAtomic(path string, b []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Dir(path), err)
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(f.Name()) // fails harmlessly once renamed
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
