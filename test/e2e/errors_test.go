package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/testutil"
)

func TestDamagedImagesAreNeverRestored(t *testing.T) {
	needCRIU(t)
	good, w := sharedImage(t)
	cases := []struct {
		name   string
		damage func(t *testing.T, dir string)
		want   string
	}{
		{"truncated pages", func(t *testing.T, dir string) {
			p := largestPagesFile(t, dir)
			fi, _ := os.Stat(p)
			if err := os.Truncate(p, fi.Size()/2); err != nil {
				t.Fatal(err)
			}
		}, "pages-"},
		{"flipped byte", func(t *testing.T, dir string) {
			f, err := os.OpenFile(largestPagesFile(t, dir), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			b := make([]byte, 1)
			if _, err := f.ReadAt(b, 4096); err != nil {
				t.Fatal(err)
			}
			b[0] ^= 0x40
			if _, err := f.WriteAt(b, 4096); err != nil {
				t.Fatal(err)
			}
		}, "checksum"},
		{"missing file", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "criu", "pstree.img"))
		}, "pstree.img"},
		{"missing manifest", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "manifest.json"))
		}, "not a gpucr image"},
		{"newer format", func(t *testing.T, dir string) {
			testutil.EditJSON(t, filepath.Join(dir, "manifest.json"), func(m map[string]any) { m["formatVersion"] = 99 })
		}, "newer"},
		{"garbled manifest", func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, "manifest.json"), []byte("{\"formatVersion\": 1, "), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "manifest.json"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := copyImage(t, good)
			c.damage(t, dir)
			count := w.read(t, "count")
			for _, verb := range [][]string{{"verify", dir}, {"restore", "-D", dir}} {
				out, code := gpucr(t, verb...)
				if code == 0 || !oneLineWith(out, c.want) {
					t.Errorf("gpucr %s: exit %d, want one line naming %q:\n%s", verb[0], code, c.want, out)
				}
			}
			// verify --json fails as JSON, naming the damage too.
			stdout, _, code := gpucrEnv(t, nil, "verify", "--json", dir)
			var e errorDoc
			if err := json.Unmarshal([]byte(stdout), &e); err != nil || code != exitFailed || e.ExitCode != code || !strings.Contains(e.Error, c.want) {
				t.Errorf("verify --json: exit %d, stdout %q (%v); want the error naming %q as JSON", code, stdout, err, c.want)
			}
			// Damaged pages are found while CRIU restores; it kills the tasks before any runs
			// (they may still be exiting when gpucr returns), and they are re-parented to the
			// test. A task that had run would have counted.
			time.Sleep(100 * time.Millisecond) // five of the counter's ticks
			if now := w.read(t, "count"); now != count {
				t.Fatalf("the counter ran from the damaged image: count %d, was %d", now, count)
			}
			testutil.WaitReaped(t, w.pid)
		})
	}
	// The undamaged original still restores: the failures above were the damage's.
	restore(t, good)
}

// The memory gpucr saved itself (mem/) is verified by the fill as it writes it, not by a
// pass of its own: a byte changed there still fails the restore before any task runs, with
// one line naming the file, and leaves nothing running.
func TestDamagedSavedMemoryFailsTheRestore(t *testing.T) {
	needCRIU(t)
	w := startCounter(t, "-mib", "40")
	dir := checkpointGone(t, w)
	saved, _ := filepath.Glob(filepath.Join(dir, criuimg.MemDir, "*"))
	if len(saved) == 0 {
		t.Fatal("the image holds no memory gpucr saved itself: the test needs a larger range")
	}
	f, err := os.OpenFile(saved[0], os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := []byte{0}
	if _, err := f.ReadAt(b, 3<<20); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x10
	if _, err := f.WriteAt(b, 3<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	count := w.read(t, "count")
	out, code := gpucr(t, "restore", "-D", dir)
	if code == 0 || !oneLineWith(out, filepath.Base(saved[0])) || !strings.Contains(out, "checksum") {
		t.Fatalf("restore of damaged saved memory: exit %d, want one line naming %s's checksum:\n%s", code, filepath.Base(saved[0]), out)
	}
	time.Sleep(100 * time.Millisecond) // five of the counter's ticks
	if now := w.read(t, "count"); now != count {
		t.Fatalf("the counter ran from the damaged image: count %d, was %d", now, count)
	}
	testutil.WaitReaped(t, w.pid)
}

func TestCheckpointRefusesBadRequests(t *testing.T) {
	needCRIU(t)
	w := startCounter(t)
	pid := strconv.Itoa(w.pid)
	notEmpty := t.TempDir()
	// A symlink to an empty directory passed the checks, and the checkpoint paused the
	// workload for an image the final rename could not put there.
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(t.TempDir(), link); err != nil {
		t.Fatal(err)
	}
	aFile := filepath.Join(t.TempDir(), "file")
	for _, f := range []string{filepath.Join(notEmpty, "x"), aFile} {
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	readOnly := t.TempDir()
	if err := syscall.Mount("tmpfs", readOnly, "tmpfs", syscall.MS_RDONLY, "size=1m"); err != nil {
		t.Fatalf("mount a read-only tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(readOnly, syscall.MNT_DETACH) })
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no such pid", []string{"checkpoint", "999999999", "-D", filepath.Join(t.TempDir(), "i")}, exitUsage, "no such process"},
		{"pid 1", []string{"checkpoint", "1", "-D", filepath.Join(t.TempDir(), "i")}, exitUsage, "PID 1"},
		{"a kernel thread", []string{"checkpoint", "2", "-D", filepath.Join(t.TempDir(), "i")}, exitUsage, "PID 2 is a kernel thread (kthreadd)"},
		{"a kernel thread, dry run", []string{"checkpoint", "2", "--dry-run", "-D", filepath.Join(t.TempDir(), "i")}, exitUsage, "PID 2 is a kernel thread"},
		{"own tree", []string{"checkpoint", strconv.Itoa(os.Getpid()), "-D", filepath.Join(t.TempDir(), "i")}, exitUsage, "gpucr itself"},
		{"not a number", []string{"checkpoint", "abc", "-D", filepath.Join(t.TempDir(), "i")}, exitUsage, "not a number"},
		{"dir not empty", []string{"checkpoint", pid, "-D", notEmpty}, exitUsage, "not empty"},
		{"dir a symlink", []string{"checkpoint", pid, "-D", link}, exitUsage, "is a symlink"},
		{"dir not writable", []string{"checkpoint", pid, "-D", filepath.Join(readOnly, "img")}, exitFailed, "not writable"},
		{"parent is a file", []string{"checkpoint", pid, "-D", filepath.Join(aFile, "img")}, exitFailed, "not a directory"},
		{"no criu", []string{"checkpoint", pid, "-D", filepath.Join(t.TempDir(), "i"), "--criu", "/nonexistent/criu"}, exitNotReady, "criu not found"},
		{"parent missing", []string{"checkpoint", pid, "-D", filepath.Join(t.TempDir(), "nope", "img")}, exitUsage, "does not exist"},
		{"restore of nothing", []string{"restore", "-D", t.TempDir()}, exitFailed, "not a gpucr image"},
		{"restore of a missing directory", []string{"restore", "-D", filepath.Join(t.TempDir(), "nope")}, exitFailed, "nope does not exist"},
		{"inspect of nothing", []string{"inspect", t.TempDir()}, exitFailed, "not a gpucr image"},
		{"unknown check", []string{"restore", "-D", t.TempDir(), "--skip-check", "colour"}, exitUsage, "unknown check"},
		{"unknown verb", []string{"chekpoint", pid}, exitUsage, "unknown command"},
		{"unknown flag", []string{"checkpoint", pid, "--nope"}, exitUsage, "unknown flag"},
		{"unknown shorthand", []string{"-t"}, exitUsage, "unknown shorthand"},
		{"missing required flag", []string{"restore"}, exitUsage, "images-dir"},
		{"a checkpoint under a store's leases", []string{"checkpoint", pid, "--to", filepath.Join(t.TempDir(), ".gpucr-leases", "x")}, exitUsage, "cannot live under a directory named \".gpucr-leases\""},
		{"a pull of a store's leases", []string{"pull", filepath.Join(t.TempDir(), ".gpucr-leases"), filepath.Join(t.TempDir(), "i")}, exitUsage, "cannot be named"},
		{"rm of a store's chunks", []string{"rm", filepath.Join(t.TempDir(), "chunks")}, exitUsage, "cannot be named"},
		{"negative lock timeout", []string{"checkpoint", pid, "-D", filepath.Join(t.TempDir(), "i"), "--lock-timeout", "-5s"}, exitUsage, "--lock-timeout -5s"},
		{"missing argument", []string{"verify"}, exitUsage, "arg"},
		{"too many arguments", []string{"verify", "a", "b"}, exitUsage, "arg"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, code := gpucr(t, c.args...)
			if code != c.code || !oneLineWith(out, c.want) {
				t.Errorf("exit %d, want %d with one line containing %q:\n%s", code, c.code, c.want, out)
			}
			// Under --json the same refusal is on stdout as JSON, for machines.
			stdout, _, code := gpucrEnv(t, nil, append(c.args, "--json")...)
			var e struct {
				Error    string `json:"error"`
				ExitCode int    `json:"exitCode"`
			}
			if err := json.Unmarshal([]byte(stdout), &e); err != nil || code != c.code || e.ExitCode != code || !strings.Contains(e.Error, c.want) {
				t.Errorf("with --json: exit %d, stdout %q (%v); want the error as JSON", code, stdout, err)
			}
		})
	}
	if !testutil.Alive(w.pid) {
		t.Fatal("the workload died from a refused checkpoint")
	}
	if entries, _ := os.ReadDir(filepath.Dir(aFile)); len(entries) != 1 {
		t.Errorf("a refused checkpoint left files: %v", entries)
	}
}

// oldCRIU is bookworm's criu 3.17, which scripts/install-deps.sh unpacks for this test.
const oldCRIU = "/var/cache/gpucr-build/old-criu/usr/sbin/criu"

func TestOldCRIUIsRefused(t *testing.T) {
	needCRIU(t)
	if _, err := os.Stat(oldCRIU); err != nil {
		testutil.SkipOrFail(t, fmt.Sprintf("no old CRIU (make deps): %v", err))
	}
	w := startCounter(t)
	for _, args := range [][]string{
		{"checkpoint", strconv.Itoa(w.pid), "-D", filepath.Join(t.TempDir(), "i"), "--criu", oldCRIU},
		{"check", "--criu", oldCRIU},
	} {
		out, code := gpucr(t, args...)
		if code != exitNotReady || !strings.Contains(out, "version 3.17") || !strings.Contains(out, "needs 4.1.0 or newer") {
			t.Errorf("gpucr %s with criu 3.17: exit %d:\n%s", args[0], code, out)
		}
	}
	if !testutil.Alive(w.pid) {
		t.Fatal("workload died")
	}
}

// A host that is not ready makes check --json print its report, one JSON document that
// says so, not the report and an error after it; exit 3 says it too.
func TestCheckJSONOnAHostNotReadyIsOneDocument(t *testing.T) {
	stdout, _, code := gpucrEnv(t, nil, "check", "--json", "--criu", "/nonexistent/criu")
	var r checkDoc
	if err := json.Unmarshal([]byte(stdout), &r); err != nil || code != exitNotReady || r.Ready || r.CRIU.OK {
		t.Fatalf("exit %d, stdout %q (%v); want exit 3 and one report saying not ready", code, stdout, err)
	}
}

// --json written as --json=true is --json too for a command line cobra refuses before
// parsing it.
func TestRefusedCommandLineWithJSONEqualsTrue(t *testing.T) {
	for _, args := range [][]string{{"--json=true", "chekpoint"}, {"verify", "--json=1"}} {
		stdout, _, code := gpucrEnv(t, nil, args...)
		var e errorDoc
		if err := json.Unmarshal([]byte(stdout), &e); err != nil || code != exitUsage || e.ExitCode != exitUsage {
			t.Errorf("gpucr %s: exit %d, stdout %q (%v); want exit 2 and the error as JSON", strings.Join(args, " "), code, stdout, err)
		}
	}
	if stdout, _, code := gpucrEnv(t, nil, "--json=false", "chekpoint"); stdout != "" || code != exitUsage {
		t.Errorf("--json=false: exit %d, stdout %q; want exit 2 and nothing on stdout", code, stdout)
	}
}

func TestNotRootIsRefused(t *testing.T) {
	needCRIU(t)
	w := startCounter(t)
	cmd := exec.Command(bin.gpucr, "checkpoint", strconv.Itoa(w.pid), "-D", filepath.Join(os.TempDir(), "gpucr-never"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitNotReady || !strings.Contains(string(out), "root") {
		t.Fatalf("as nobody: %v: %s", err, out)
	}
	if !testutil.Alive(w.pid) {
		t.Fatal("workload died")
	}
	// A request that is wrong whoever makes it is told so first (review: "must run as
	// root" hid the missing -D).
	cmd = exec.Command(bin.gpucr, "restore")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err = cmd.CombinedOutput()
	if !errors.As(err, &ee) || ee.ExitCode() != exitUsage || !strings.Contains(string(out), "restore needs") {
		t.Fatalf("restore with no image, as nobody: %v: %s", err, out)
	}
}

// counterCopy copies the counter program to a file of its own, and returns it with its
// bytes: a program the test can take away or replace.
func counterCopy(t *testing.T) (string, []byte) {
	t.Helper()
	prog := filepath.Join(t.TempDir(), "counter-copy")
	b, err := os.ReadFile(bin.counter)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(prog, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return prog, b
}

// A restore where a file the image's processes mapped is missing (here the program itself,
// as on a host without it) fails before CRIU starts, naming the file; with the file back
// it restores.
func TestRestoreNamesAMissingFile(t *testing.T) {
	needCRIU(t)
	prog, _ := counterCopy(t)
	w := startCounterOf(t, prog)
	dir := checkpointGone(t, w)

	if err := os.Rename(prog, prog+".away"); err != nil {
		t.Fatal(err)
	}
	out, code := gpucr(t, "restore", "-D", dir)
	if code != 1 || !oneLineWith(out, "a file the image needs is missing on this host: "+prog) {
		t.Fatalf("restore without %s: exit %d:\n%s", prog, code, out)
	}
	if testutil.Alive(w.pid) {
		t.Fatal("restore went ahead without the file")
	}
	if err := os.Rename(prog+".away", prog); err != nil {
		t.Fatal(err)
	}
	restore(t, dir)
}

// A restore by a gpucr that is the first process of its PID namespace is refused before it
// starts: the kernel ends the namespace, and every process in it, when that gpucr exits, so
// the tree it restored detached was gone once it reported success (hostile test, run as the
// PID-in-use error then advised). The image restores as it is where the job can live.
func TestRestoreAsANamespacesFirstProcessIsRefused(t *testing.T) {
	needCRIU(t)
	w := startCounter(t)
	dir := checkpointGone(t, w)

	cmd := exec.Command("unshare", "--pid", "--fork", "--mount-proc", bin.gpucr, "restore", "-D", dir)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitNotReady || !oneLineWith(string(out), "gpucr is PID 1 of its PID namespace") {
		t.Fatalf("restore as a namespace's first process: %v:\n%s", err, out)
	}
	// Started by a namespace's first process, gpucr cannot know how long that lives: it
	// restores, and says the tree dies with that process (review: it reported success, and
	// the job was gone once the shell exited).
	cmd = exec.Command("unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", bin.gpucr+" restore -D "+dir+"; sleep 0.5")
	out, err = cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "first process (PID 1, sh) is gpucr's parent: the kernel kills them when it exits") {
		t.Fatalf("restore started by a namespace's first process: %v:\n%s", err, out)
	}
	// In a PID namespace that kept its parent's /proc, CRIU cannot start: the restore ran
	// into "criu restore failed: operation failed (msg: err:56)" and named a log CRIU never
	// wrote, after warning of the host's PID 1 as gpucr's parent (hostile test).
	cmd = exec.Command("unshare", "--pid", "--fork", "sh", "-c", bin.gpucr+" restore -D "+dir)
	out, err = cmd.CombinedOutput()
	if !errors.As(err, &ee) || ee.ExitCode() != exitNotReady || !oneLineWith(string(out), "/proc here is another PID namespace's") {
		t.Fatalf("restore in a PID namespace without its own /proc: %v:\n%s", err, out)
	}
	// A checkpoint there read the host's PIDs in the wrong namespace and said the target was
	// PID 1 of a namespace of its own (review): refused alike, the workload untouched.
	w2 := startCounter(t)
	cmd = exec.Command("unshare", "--pid", "--fork", "sh", "-c", bin.gpucr+" checkpoint "+strconv.Itoa(w2.pid)+" -D "+filepath.Join(t.TempDir(), "img"))
	out, err = cmd.CombinedOutput()
	if !errors.As(err, &ee) || ee.ExitCode() != exitNotReady || !oneLineWith(string(out), "/proc here is another PID namespace's") {
		t.Fatalf("checkpoint in a PID namespace without its own /proc: %v:\n%s", err, out)
	}
	w2.checkRunsOn(t, "a checkpoint refused in a namespace without its own /proc")
	restore(t, dir)
}

// A checkpoint onto a disk that fills up fails with one line that says so, leaves nothing
// behind, and the workload counts on with its memory intact: on a 24 MiB filesystem CRIU's
// files fit and the 64 MiB gpucr saves itself do not; on a 256 KiB one CRIU's do not.
func TestCheckpointOntoAFullDisk(t *testing.T) {
	needCRIU(t)
	w := startCounter(t, "-mib", "64")
	w.waitCount(t, 3)
	for _, size := range []int{24 << 20, 256 << 10} {
		t.Run(strconv.Itoa(size>>10)+"KiB", func(t *testing.T) {
			disk := smallTmp(t, size)
			out, code := gpucr(t, "checkpoint", strconv.Itoa(w.pid), "-D", filepath.Join(disk, "img"))
			if code != exitFailed || !oneLineWith(out, "disk for the image is full") {
				t.Errorf("exit %d, want %d with one line saying the disk is full:\n%s", code, exitFailed, out)
			}
			if entries, _ := os.ReadDir(disk); len(entries) != 0 {
				t.Errorf("a failed checkpoint left %v", entries)
			}
			w.checkRunsOn(t, "a checkpoint onto a full disk")
		})
	}
	// Streamed, the image's small files are staged under TMPDIR: the message names it, not
	// the image's disk, which a streamed checkpoint has none of (hostile test).
	t.Run("TMPDIR of a streamed checkpoint", func(t *testing.T) {
		tmp := smallTmp(t, 64<<10)
		_, stderr, code := gpucrEnv(t, []string{"TMPDIR=" + tmp}, "checkpoint", strconv.Itoa(w.pid), "--to", filepath.Join(t.TempDir(), "store", "ckpt"))
		if code != exitFailed || !oneLineWith(stderr, "where a streamed checkpoint stages CRIU's small files") || !strings.Contains(stderr, tmp) {
			t.Errorf("exit %d, want %d with one line naming %s:\n%s", code, exitFailed, tmp, stderr)
		}
		w.checkRunsOn(t, "a streamed checkpoint with a full TMPDIR")
	})
}

// A push or fold onto a disk that fills up said so through the file it was writing, a
// temporary one or a chunk ("write /d/store/chunks/.ab12...tmp-9: no space left on device",
// "8 MiB to write into /d/.folded.partial-staging-..."): one line names the destination as
// given, what was needed where it is known, and what to do, and no fold is left behind.
func TestPushAndFoldOntoAFullDiskNameTheDestination(t *testing.T) {
	needCRIU(t)
	w := startCounter(t, "-random-mib", "8") // incompressible: the store cannot take it
	img := filepath.Join(t.TempDir(), "img")
	mustGpucr(t, "checkpoint", "--leave-running", strconv.Itoa(w.pid), "-D", img)
	disk := smallTmp(t, 1<<20)
	store, folded := filepath.Join(disk, "store", "ckpt"), filepath.Join(disk, "folded")
	for _, tt := range []struct {
		args []string
		want []string
		not  string
	}{
		{[]string{"push", img, store}, []string{"the store for " + store + " is full: free space there", "(no space left on device)"}, "chunks/"},
		{[]string{"fold", img, folded}, []string{"the disk for " + folded + " is full: ", " MiB needed, ", "fold onto another disk"}, "partial"},
	} {
		out, code := gpucr(t, tt.args...)
		ok := code == exitFailed && oneLineWith(out, tt.want[0]) && !strings.Contains(out, tt.not) && !strings.Contains(out, ".tmp-")
		for _, w := range tt.want[1:] {
			ok = ok && strings.Contains(out, w)
		}
		if !ok {
			t.Errorf("gpucr %s: exit %d, want %d with one line saying %q, naming no file of gpucr's:\n%s", strings.Join(tt.args, " "), code, exitFailed, tt.want, out)
		}
	}
	if _, err := os.Lstat(folded); !os.IsNotExist(err) {
		t.Errorf("a fold onto a full disk left its directory (%v)", err)
	}
}

// inspect reads an image's files as restore does, a regular file beneath the image or
// nothing: a FIFO put in place of one of CRIU's files, of the AMD plugin's or of a log made
// it wait for good, a symlink to /dev/zero as container.json made it fill its memory
// (hostile tests).
func TestInspectWaitsOnNothingAnImageHolds(t *testing.T) {
	needCRIU(t)
	src := storeImage(t)
	for _, file := range []string{"criu/pstree.img", "criu/amdgpu-kfd-1.img", "logs/stats-dump", "container.json"} {
		t.Run(file, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "img")
			mustRun(t, "cp", "-a", src, dir)
			path := filepath.Join(dir, filepath.FromSlash(file))
			_ = os.Remove(path)
			plant := func() error { return syscall.Mkfifo(path, 0o600) }
			if file == "container.json" {
				plant = func() error { return os.Symlink("/dev/zero", path) }
			}
			if err := plant(); err != nil {
				t.Fatal(err)
			}
			// Under timeout(1): the bug was a wait with no end.
			var stderr bytes.Buffer
			cmd := exec.Command("timeout", "20", bin.gpucr, "inspect", dir)
			cmd.Stderr = &stderr
			err := cmd.Run()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			}
			if code == 124 || code == 137 {
				t.Fatalf("inspect of an image with %s planted waited until killed", file)
			}
			if code == 0 && file != "logs/stats-dump" {
				t.Errorf("inspect of an image with %s planted: exit 0", file)
			}
			if code != 0 && !oneLineWith(stderr.String(), "gpucr: ") {
				t.Errorf("exit %d without one line:\n%s", code, stderr.String())
			}
		})
	}
}

// A run directory others could write makes every verb refuse, so `gpucr check` says the
// host is not ready and why, exit 3, instead of ready with a warning (review).
func TestCheckOfAJournalOthersCanWriteIsNotReady(t *testing.T) {
	needCRIU(t)
	open := t.TempDir()
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	stdout, _, code := gpucrEnv(t, nil, "check", "--run-dir", filepath.Join(open, "run"), "--json")
	var r struct {
		Ready        bool   `json:"ready"`
		JournalError string `json:"journalError"`
	}
	if err := json.Unmarshal([]byte(stdout), &r); err != nil || code != exitNotReady || r.Ready || !strings.Contains(r.JournalError, "not root's alone") {
		t.Errorf("check: exit %d, %+v (%v); want exit %d, not ready, the journal named", code, r, err, exitNotReady)
	}
}

// CRIU reopens a restored process's files by their paths: one removed from a directory
// others may write and put back there by another user, same size, had root's restored job
// run that user's code (hostile test). A file whose owner changed since the checkpoint is
// refused before CRIU starts; given its owner back, it restores.
func TestRestoreRefusesAFileAnotherUserPutBack(t *testing.T) {
	needCRIU(t)
	prog, b := counterCopy(t)
	w := startCounterOf(t, prog)
	dir := checkpointGone(t, w)

	if err := os.Remove(prog); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(prog, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(prog, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	out, code := gpucr(t, "restore", "-D", dir)
	if code != 1 || !oneLineWith(out, "a file the image reopens is not the one it had: "+prog+" is a file of uid 65534") {
		t.Fatalf("restore with %s put back by another user: exit %d:\n%s", prog, code, out)
	}
	if testutil.Alive(w.pid) {
		t.Fatal("restore went ahead with the other user's file")
	}
	if err := os.Chown(prog, 0, 0); err != nil {
		t.Fatal(err)
	}
	restore(t, dir)
}

// A new image or a store put inside an image adds files its manifest does not list: pull
// into an image's directory and checkpoint -D X --to X said they succeeded, and the image
// no longer verified (hostile test). Both are refused before anything is written, and the
// workload runs on.
func TestNoImageNorStoreInsideAnImage(t *testing.T) {
	needCRIU(t)
	w := startCounter(t)
	base := t.TempDir()
	img := filepath.Join(base, "img")
	if out, code := gpucr(t, "checkpoint", strconv.Itoa(w.pid), "-R", "-D", img); code != 0 {
		t.Fatalf("checkpoint: exit %d:\n%s", code, out)
	}
	store := filepath.Join(base, "store")
	if out, code := gpucr(t, "push", img, store+"/c"); code != 0 {
		t.Fatalf("push: exit %d:\n%s", code, out)
	}
	if out, code := gpucr(t, "pull", store+"/c", filepath.Join(img, "criu", "x")); code != exitUsage || !oneLineWith(out, "inside the image "+img) {
		t.Errorf("pull into the image: exit %d:\n%s", code, out)
	}
	both := filepath.Join(base, "both")
	if out, code := gpucr(t, "checkpoint", strconv.Itoa(w.pid), "-R", "-D", both, "--to", both); code != exitUsage || !oneLineWith(out, "overlap") {
		t.Errorf("checkpoint -D X --to X: exit %d:\n%s", code, out)
	}
	if out, code := gpucr(t, "verify", img); code != 0 {
		t.Fatalf("the image after the refusals: exit %d:\n%s", code, out)
	}
	if !testutil.Alive(w.pid) {
		t.Fatal("the workload died")
	}
	w.waitCount(t, w.read(t, "count")+2)
}

// Numbers out of their range are wrong requests (exit 2), refused before anything runs:
// --criu-log-level 99 was passed to CRIU, --nproc-per-node 0 exited 1 (hostile test).
func TestOutOfRangeNumbersAreUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"checkpoint", "1", "--criu-log-level", "99", "-D", filepath.Join(t.TempDir(), "img")},
		{"restore", "-D", t.TempDir(), "--criu-log-level", "-5"},
		{"run", "--nproc-per-node", "0", "--", "true"},
	} {
		if out, code := gpucr(t, args...); code != exitUsage || strings.Contains(strings.TrimSpace(out), "\n") {
			t.Errorf("gpucr %s: exit %d:\n%s", strings.Join(args, " "), code, out)
		}
	}
}

// gpucr run's ranks write to its stdout themselves, so no JSON document could be all that
// is there: --json is refused (exit 2, its error as the one document) rather than ignored.
func TestRunRefusesJSON(t *testing.T) {
	out, code := gpucr(t, "run", "--json", "--", "true")
	if code != exitUsage || !strings.Contains(out, `"exitCode":2`) {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}

// A program gpucr run cannot start, and a PID recover cannot find, are the request's
// mistakes, said in words: they were "launch rank 0: fork/exec ..." with a failed job's
// exit code, and "not stranded on a GPU" for a process that does not exist (doc walk).
func TestRunAndRecoverNameWhatIsMissing(t *testing.T) {
	out, code := gpucr(t, "run", "--", "/nonexistent/job")
	if code != exitUsage || !oneLineWith(out, "cannot run /nonexistent/job: no such file or directory") {
		t.Errorf("run of a missing program: exit %d:\n%s", code, out)
	}
	out, code = gpucr(t, "recover", "--pid", "4194305") // above the kernel's largest pid_max
	if code != exitUsage || !oneLineWith(out, "process 4194305: no such process") {
		t.Errorf("recover of a PID that does not exist: exit %d:\n%s", code, out)
	}
}

// A --gpu-map for an image with no GPU state had nothing to read it, and a mistyped map of
// a job thought to be a GPU's restored without a word (hostile test): refused, exit 2.
func TestGPUMapOfAnImageWithoutGPUsIsRefused(t *testing.T) {
	needCRIU(t)
	w := startCounter(t)
	dir := checkpointGone(t, w)
	if out, code := gpucr(t, "restore", "-D", dir, "--gpu-map", "a"); code != exitUsage || !oneLineWith(out, "the image holds no GPU state to move") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	if testutil.Alive(w.pid) {
		t.Fatal("restored all the same")
	}
	restore(t, dir)
}

// The same mistyped --gpu-map of a GPU image was a failure (exit 1) where the image had
// GPU state, a wrong request (exit 2) where it had none (hostile test with the fake
// driver): each mistake is a usage error, one line, nothing restored, and the image
// restores once the map is right.
func TestMistypedGPUMapIsAUsageError(t *testing.T) {
	needCRIU(t)
	drv := newFakeDriver(t)
	w := startCounter(t, "-gpu-state", drv.dir)
	drv.claim(t, w.pid)
	dir := filepath.Join(t.TempDir(), "img")
	mustGpucrEnv(t, drv.env, "checkpoint", strconv.Itoa(w.pid), "-D", dir)
	testutil.WaitGone(t, w.pid)
	for spec, want := range map[string]string{
		"0": "want OLD=NEW pairs", "0=": "want OLD=NEW pairs", "0=5": `this host has no GPU "5"`,
		"5=0": `the image has no GPU "5"`, "0=0,0=1": "twice", "0=0,1=0": "both on host GPU 0",
	} {
		out, errOut, code := gpucrEnv(t, drv.env, "restore", "-D", dir, "--gpu-map", spec)
		if code != exitUsage || out != "" || !oneLineWith(errOut, want) {
			t.Fatalf("--gpu-map %q: exit %d, want %d and one line naming %q:\n%s%s", spec, code, exitUsage, want, out, errOut)
		}
		if testutil.Alive(w.pid) {
			t.Fatalf("--gpu-map %q: restored all the same", spec)
		}
	}
	mustGpucrEnv(t, drv.env, "restore", "-D", dir, "--gpu-map", "0=0")
}
