package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/image/imagetest"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/store/chunked"
	"github.com/gpucr/gpucr/internal/testutil"
)

// Images changed after their checkpoint and sealed again, as whoever can write an image (an
// object store, another host) could: each is refused with one line and a non-zero exit
// before anything runs, and nothing outside the image is touched — here a bystander process
// whose memory a crafted image aims at.
func TestCraftedImagesAreRefused(t *testing.T) {
	needCRIU(t)
	good, w := sharedImage(t)
	bystander := startCounter(t, "-mib", "4")
	cases := []struct {
		name   string
		change func(t *testing.T, staged string, m *image.Manifest)
		want   string
	}{
		{"memory for a process outside the tree", func(t *testing.T, staged string, _ *image.Manifest) {
			testutil.WriteFile(t, filepath.Join(staged, criuimg.MemDir, criuimg.MemName(bystander.pid, 0x10000)), make([]byte, 4096))
		}, "not in the image's tree"},
		// A thread's ID is no PID /proc lists, so no check of PIDs in use sees it taken; a
		// hostile test had the fill write into the bystander through one of its threads.
		{"memory for a thread of a process outside the tree, listed as a process", func(t *testing.T, staged string, m *image.Manifest) {
			tid, addr := otherThread(t, bystander.pid), writableAnon(t, bystander.pid)
			m.Processes = append(m.Processes, image.Process{PID: tid, PPID: 1, Command: "x", Threads: 1})
			testutil.WriteFile(t, filepath.Join(staged, criuimg.MemDir, criuimg.MemName(tid, addr)), bytes.Repeat([]byte{0x5a}, 4096))
		}, "not among the restored processes"},
		{"pages file shorter than its pagemap", func(t *testing.T, staged string, _ *image.Manifest) {
			p := largestPagesFile(t, staged)
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(p, fi.Size()-4096); err != nil {
				t.Fatal(err)
			}
		}, "damaged, or changed with its manifest"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := imagetest.RecommitWith(t, good, func(staged string, m *image.Manifest) { tc.change(t, staged, m) })
			mustGpucr(t, "verify", dir) // sealed again: the seal alone cannot tell
			out, code := gpucr(t, "restore", "-D", dir)
			if code == 0 || !oneLineWith(out, tc.want) {
				t.Fatalf("restore: exit %d, want one line naming %q:\n%s", code, tc.want, out)
			}
			if testutil.Alive(w.pid) {
				t.Fatal("a process of the refused image runs")
			}
			bystander.checkRunsOn(t, tc.name)
			if v := bystander.verify(t, bystander.pid); v != "ok" {
				t.Fatalf("the bystander's memory: %s", v)
			}
		})
	}
	// Files the manifest does not list, or a symlink out of the image, are refused even
	// when the seal is left alone.
	for name, add := range map[string]func(dir string){
		"unlisted file": func(dir string) {
			testutil.WriteFile(t, filepath.Join(dir, criuimg.MemDir, criuimg.MemName(bystander.pid, 0x1000)), make([]byte, 4096))
		},
		"symlink to a host file": func(dir string) {
			if err := os.Symlink("/etc/shadow", filepath.Join(dir, "criu", "ghost.img")); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := copyImage(t, good)
			add(dir)
			out, code := gpucr(t, "restore", "-D", dir)
			if code == 0 || !strings.Contains(out, "image file") {
				t.Fatalf("restore: exit %d:\n%s", code, out)
			}
			if testutil.Alive(w.pid) {
				t.Fatal("a process of the refused image runs")
			}
		})
	}
}

// otherThread is the ID of a thread of process pid other than its first.
func otherThread(t *testing.T, pid int) int {
	t.Helper()
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if tid, err := strconv.Atoi(e.Name()); err == nil && tid != pid {
			return tid
		}
	}
	t.Fatalf("process %d has one thread", pid)
	return 0
}

// writableAnon is the start of a private anonymous mapping process pid can write.
func writableAnon(t *testing.T, pid int) uint64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) == 5 && f[1] == "rw-p" {
			start, _, _ := strings.Cut(f[0], "-")
			addr, err := strconv.ParseUint(start, 16, 64)
			if err == nil {
				return addr
			}
		}
	}
	t.Fatalf("process %d maps no private anonymous memory it can write", pid)
	return 0
}

// A CRIU that hangs — before it creates the tasks, or with them restored but never resumed
// (here an action script that sleeps, read from CRIU's config file) — does not hang gpucr:
// SIGTERM ends the restore with one line, CRIU is killed, nothing of the restore is left
// running, the image is unchanged and restores once CRIU behaves.
// hangScript is a CRIU action script that hangs at the action named by $HANG_AT, after
// writing its own PID to $CRIU_PID.script and CRIU's to $CRIU_PID.
const hangScript = "#!/bin/sh\n[ \"$CRTOOLS_SCRIPT_ACTION\" = \"$HANG_AT\" ] || exit 0\necho $$ > \"$CRIU_PID.script\"\necho $PPID > \"$CRIU_PID\"\nexec sleep 1000\n"

// hangConf writes hangScript and a CRIU configuration that runs it into a new directory,
// and returns the configuration's path and the directory.
func hangConf(t *testing.T) (conf, dir string) {
	t.Helper()
	dir = t.TempDir()
	script := filepath.Join(dir, "hang.sh")
	testutil.WriteFile(t, script, []byte(hangScript))
	if err := os.Chmod(script, 0o700); err != nil {
		t.Fatal(err)
	}
	conf = filepath.Join(dir, "criu.conf")
	testutil.WriteFile(t, conf, []byte("action-script "+script+"\n"))
	return conf, dir
}

func TestInterruptedRestoreOfAHungCRIU(t *testing.T) {
	needCRIU(t)
	dir, w := sharedImage(t)
	conf, tmp := hangConf(t)
	for _, at := range []string{"pre-restore", "post-restore"} {
		t.Run(at, func(t *testing.T) {
			criuPID := filepath.Join(tmp, at+".pid")
			// -q: the hung phase outlasts the interval at which progress is logged.
			cmd := exec.Command(bin.gpucr, "restore", "-q", "-D", dir)
			cmd.Env = append(os.Environ(), "CRIU_CONFIG_FILE="+conf, "HANG_AT="+at, "CRIU_PID="+criuPID)
			var out strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			criu := waitPIDFile(t, criuPID)
			t.Cleanup(func() { testutil.KillAndReap(waitPIDFile(t, criuPID+".script")) })
			err := signalAndWait(t, cmd, syscall.SIGTERM, &out)
			if err == nil || !oneLineWith(out.String(), "CRIU was stopped") {
				t.Fatalf("restore: %v, want one line saying CRIU was stopped:\n%s", err, out.String())
			}
			if p, err := proctree.Read(criu); err == nil && !p.Zombie {
				t.Fatalf("CRIU %d still runs after the restore ended", criu)
			}
			if p, err := proctree.Read(w.pid); err == nil && !p.Zombie {
				t.Fatal("a restored process runs after the restore ended")
			}
			mustGpucr(t, "verify", dir)
		})
	}
	testutil.WaitGone(t, w.pid)
	mustGpucr(t, "restore", "-D", dir)
	t.Cleanup(func() { testutil.KillAndReap(w.pid) })
	if v := w.verify(t, w.pid); v != "ok" {
		t.Fatalf("memory after the restore: %s", v)
	}
}

// A CRIU that hangs inside runc's restore of a container, before the tasks exist or after,
// goes with the restore: on SIGTERM gpucr stops runc and its CRIU and ends with one line; on
// SIGKILL the guardian does. Either way no CRIU, action script or restored task is left, the
// container is gone and the image restores afterwards.
func TestInterruptedContainerRestoreOfAHungCRIU(t *testing.T) {
	_, realCRIU := needRunc(t)
	tmp := t.TempDir()
	hang := filepath.Join(tmp, "hang.sh")
	testutil.WriteFile(t, hang, []byte(hangScript))
	// CRIU as runc starts it, with the hang script added to the configuration gpucr gives it.
	wrapper := filepath.Join(tmp, "criu")
	testutil.WriteFile(t, wrapper, []byte(fmt.Sprintf("#!/bin/sh\nif [ -n \"$CRIU_CONFIG_FILE\" ] && [ -n \"$HANG_AT\" ]; then\n"+
		"  c=%s/conf.$$\n  { cat \"$CRIU_CONFIG_FILE\"; echo 'action-script %s'; } > $c\n  export CRIU_CONFIG_FILE=$c\nfi\nexec %s \"$@\"\n",
		tmp, hang, realCRIU)))
	for _, f := range []string{hang, wrapper} {
		if err := os.Chmod(f, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, at := range []string{"pre-restore", "post-restore"} {
		for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
			name := at + "-" + strings.ToLower(unix.SignalName(sig))
			t.Run(name, func(t *testing.T) {
				host := newCrashHost(t)
				runc, bundle, id, _ := counterContainer(t, name, "-mib", "8")
				dir := filepath.Join(t.TempDir(), "img")
				mustGpucr(t, append([]string{"checkpoint", "--container", id, "-D", dir}, host.flags()...)...)
				frozen := count(t, bundle)
				criuPID := filepath.Join(tmp, name+".pid")
				cmd := exec.Command(bin.gpucr, append([]string{"restore", "-q", "--container", id, "-D", dir, "--criu", wrapper}, host.flags()...)...)
				cmd.Env = append(os.Environ(), "HANG_AT="+at, "CRIU_PID="+criuPID)
				var out strings.Builder
				cmd.Stdout, cmd.Stderr = &out, &out
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				criu, script := waitPIDFile(t, criuPID), waitPIDFile(t, criuPID+".script")
				t.Cleanup(func() { testutil.KillAndReap(script); testutil.KillAndReap(criu) })
				err := signalAndWait(t, cmd, sig, &out)
				if sig == syscall.SIGKILL {
					host.checkClean(t)
				} else if err == nil || !oneLineWith(out.String(), "runc and its CRIU were stopped") {
					t.Fatalf("restore: %v, want one line saying runc and CRIU were stopped:\n%s", err, out.String())
				}
				for _, pid := range []int{criu, script} {
					if !testutil.ExitedWithin(pid, 5*time.Second) {
						t.Errorf("process %d of the hung restore still runs after it ended", pid)
					}
				}
				if !gone(runc, id) {
					t.Errorf("container %s is left after the interrupted restore", id)
				}
				if pids := inRoot(filepath.Join(bundle, "rootfs")); len(pids) > 0 {
					t.Errorf("processes %v still run in the container's root", pids)
				}
				mustGpucr(t, "verify", dir)
				mustGpucr(t, append([]string{"restore", "--container", id, "-D", dir}, host.flags()...)...)
				checkCountsOn(t, bundle, frozen)
			})
		}
	}
}

// signalAndWait sends sig to the gpucr that cmd runs and returns how it ended, failing t if
// it runs on for 30 s; out is its output, for the failure.
func signalAndWait(t *testing.T, cmd *exec.Cmd, sig syscall.Signal, out *strings.Builder) error {
	t.Helper()
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill() // the test fails either way; the kill only ends the hung gpucr
		t.Fatalf("gpucr did not end within 30 s of %v:\n%s", sig, out.String())
		return nil
	}
}

// inRoot lists the processes whose root directory is root.
func inRoot(root string) []int {
	all, _ := proctree.All()
	var pids []int
	for _, p := range all {
		if r, err := os.Readlink(fmt.Sprintf("/proc/%d/root", p.PID)); err == nil && r == root {
			pids = append(pids, p.PID)
		}
	}
	return pids
}

// waitPIDFile waits for a PID written to path.
func waitPIDFile(t *testing.T, path string) int {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if b, err := os.ReadFile(path); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				return pid
			}
		}
	}
	t.Fatalf("nothing wrote a PID to %s", path)
	return 0
}

// A pushed checkpoint whose object manifest gained a file — here a zero-chunk memory file
// aimed at a bystander, the smallest addition a store's writer can make — is refused by pull
// and by restore --from, nothing is left at the destination and the bystander is untouched.
func TestTamperedStoreManifestIsRefused(t *testing.T) {
	needCRIU(t)
	good, w := sharedImage(t)
	bystander := startCounter(t, "-mib", "4")
	loc := filepath.Join(t.TempDir(), "store", "ckpt")
	mustGpucr(t, "push", good, loc)
	obj := filepath.Join(loc, chunked.ManifestObject)
	b, err := os.ReadFile(obj)
	if err != nil {
		t.Fatal(err)
	}
	var m chunked.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	m.Files = append(m.Files, chunked.File{Path: criuimg.MemDir + "/" + criuimg.MemName(bystander.pid, 0x10000), Size: 4096,
		Chunks: []chunked.Chunk{{Size: 4096, Zero: true}}})
	if b, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	testutil.WriteFile(t, obj, b)
	for name, args := range map[string][]string{
		"pull":           {"pull", loc, filepath.Join(t.TempDir(), "pulled")},
		"restore --from": {"restore", "--from", loc, "-D", filepath.Join(t.TempDir(), "pulled")},
	} {
		out, code := gpucr(t, args...)
		if code == 0 || !oneLineWith(out, "not listed in the manifest") {
			t.Fatalf("%s: exit %d, want one line naming the unlisted file:\n%s", name, code, out)
		}
		if dest := args[len(args)-1]; name == "pull" {
			if _, err := os.Stat(dest); !os.IsNotExist(err) {
				t.Fatalf("%s left %s: %v", name, dest, err)
			}
		}
		if testutil.Alive(w.pid) {
			t.Fatalf("%s: a process of the refused image runs", name)
		}
	}
	bystander.checkRunsOn(t, "a tampered store manifest")
	if v := bystander.verify(t, bystander.pid); v != "ok" {
		t.Fatalf("the bystander's memory: %s", v)
	}
}

// A restore stopped before its tasks are whole kills, at the image's PIDs, only what is
// still CRIU's own fork: a crafted manifest may list any PID, and another user's process
// started there while the restore ran lives (a hostile test had it SIGKILLed, through one
// of its threads, when gpucr was interrupted).
func TestInterruptedRestoreSparesAProcessAtAListedPID(t *testing.T) {
	needCRIU(t)
	good, _ := sharedImage(t)
	pid := unusedPID(t)
	dir := imagetest.RecommitWith(t, good, func(_ string, m *image.Manifest) {
		m.Processes = append(m.Processes, image.Process{PID: pid, PPID: m.RootPID, Command: "listed", Threads: 1})
	})
	conf, tmp := hangConf(t)
	criuPID := filepath.Join(tmp, "criu.pid")
	cmd := exec.Command(bin.gpucr, "restore", "-q", "-D", dir)
	cmd.Env = append(os.Environ(), "CRIU_CONFIG_FILE="+conf, "HANG_AT=pre-restore", "CRIU_PID="+criuPID)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitPIDFile(t, criuPID)
	t.Cleanup(func() { testutil.KillAndReap(waitPIDFile(t, criuPID+".script")) })
	other := startAt(t, pid)
	if err := signalAndWait(t, cmd, syscall.SIGTERM, &out); err == nil || !oneLineWith(out.String(), "CRIU was stopped") {
		t.Fatalf("restore: %v, want one line saying CRIU was stopped:\n%s", err, out.String())
	}
	if !testutil.Alive(other) {
		t.Fatalf("the interrupted restore killed process %d, another user's at a PID its image lists", other)
	}
}

// unusedPID is a PID no process or thread holds, well ahead of the next the kernel gives
// (wrapping below pid_max, as the kernel does).
func unusedPID(t *testing.T) int {
	t.Helper()
	read := func(name string) int {
		b, err := os.ReadFile("/proc/sys/kernel/" + name)
		if err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return n
	}
	last, limit := read("ns_last_pid"), read("pid_max")
	const low = 1000 // the kernel gives the lowest PIDs to its threads at boot
	for i := range 10000 {
		pid := low + (last+5000+i)%(limit-low)
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); os.IsNotExist(err) {
			return pid
		}
	}
	t.Fatal("no unused PID found")
	return 0
}

// startAt starts a process of user nobody at PID pid, through the kernel's last PID, and
// kills it when the test ends.
func startAt(t *testing.T, pid int) int {
	t.Helper()
	return testutil.StartAt(t, pid, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sleep", "1000").Process.Pid
}

// A crafted image that lists another process's thread as one of its GPU processes: the
// driver's restore and unlock reach only processes the restore made. A hostile test had
// root's restore unlock a bystander's job that the driver held checkpointed (its own
// checkpoint in flight) through one of its threads, which no check of PIDs in use sees.
func TestGPURestoreReachesOnlyTheRestoredProcesses(t *testing.T) {
	needCRIU(t)
	drv := newFakeDriver(t)
	w := startCounter(t, "-mib", "4", "-gpu-state", drv.dir)
	drv.claim(t, w.pid)
	dir := filepath.Join(t.TempDir(), "img")
	mustGpucrEnv(t, drv.env, "checkpoint", strconv.Itoa(w.pid), "-D", dir)
	bystander := startCounter(t, "-mib", "4")
	tid := otherThread(t, bystander.pid)
	testutil.WriteFile(t, filepath.Join(drv.dir, strconv.Itoa(tid)), []byte("2\n"))
	crafted := imagetest.RecommitWith(t, dir, func(_ string, m *image.Manifest) {
		m.Processes = append(m.Processes, image.Process{PID: tid, PPID: 1, Command: "x", Threads: 1})
		listed := m.GPUs[0].Processes[0]
		listed.PID = tid
		m.GPUs[0].Processes = append(m.GPUs[0].Processes, listed)
	})
	out, errOut, code := gpucrEnv(t, drv.env, "restore", "-D", crafted)
	if code == 0 || !oneLineWith(errOut, fmt.Sprintf("GPU process %d of the image was not restored", tid)) {
		t.Fatalf("restore: exit %d, want one line naming the thread:\n%s%s", code, out, errOut)
	}
	if st := drv.state(tid); st != "2" {
		t.Fatalf("the bystander's GPU state is %s, want 2 (checkpointed, as its own driver call left it)", st)
	}
	if testutil.Alive(w.pid) {
		t.Fatal("a process of the refused image runs")
	}
	bystander.checkRunsOn(t, "the crafted restore")
}

// A TMPDIR another user owns (a batch job's) let that user rename root's restore work
// directory and put a symlink in its place: root's CRIU wrote its log through it over a
// root-only file (hostile test). A restore refuses such a TMPDIR before it makes anything
// there, and restores once given one only root can change.
func TestRestoreRefusesATempDirOthersCanChange(t *testing.T) {
	needCRIU(t)
	w := startCounter(t)
	w.waitCount(t, 2)
	dir := filepath.Join(t.TempDir(), "img")
	mustGpucr(t, "checkpoint", strconv.Itoa(w.pid), "-D", dir)
	testutil.WaitGone(t, w.pid)
	theirs := filepath.Join(t.TempDir(), "theirs")
	if err := os.Mkdir(theirs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(theirs, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := gpucrEnv(t, []string{"TMPDIR=" + theirs}, "restore", "-D", dir)
	if code == 0 || !oneLineWith(errOut, "temporary directory "+theirs) || !oneLineWith(errOut, "others could swap what root writes there") {
		t.Fatalf("restore with a TMPDIR another user owns: exit %d\n%s%s", code, out, errOut)
	}
	if left, _ := os.ReadDir(theirs); len(left) > 0 {
		t.Errorf("the refused restore made %v in the other user's TMPDIR", left)
	}
	mustGpucr(t, "restore", "-D", dir)
	t.Cleanup(func() { testutil.KillAndReap(w.pid) })
	frozen := w.read(t, "count")
	w.waitCount(t, frozen+2)
}
