package criuimg

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/gpucr/gpucr/internal/testutil"
)

// CheckReopened compares what the kernel names each restored descriptor, program, working
// and root directory and mapping by with the paths the image gives them, and refuses a
// path in /proc of a process the restore did not make.
func TestCheckReopened(t *testing.T) {
	proc := t.TempDir()
	pidDir := filepath.Join(proc, "4242")
	if err := os.MkdirAll(filepath.Join(pidDir, "fd"), 0o755); err != nil {
		t.Fatal(err)
	}
	link := func(name, to string) {
		os.Remove(filepath.Join(pidDir, name))
		if to == "" {
			return
		}
		if err := os.Symlink(to, filepath.Join(pidDir, name)); err != nil {
			t.Fatal(err)
		}
	}
	procfs := []string{"/proc", "/srv/jail/proc"} // the host's, and a chroot's
	whole := map[string]string{"fd/3": "/home/u/work/data", "fd/4": "/proc/4242/status", "exe": "/usr/bin/sleep", "cwd": "/home/u/work", "root": "/"}
	for name, to := range whole {
		link(name, to)
	}
	writeMaps := func(m string) {
		if err := os.WriteFile(filepath.Join(pidDir, "maps"), []byte(m), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	goodMaps := "55d0c0000000-55d0c0001000 r--p 00000000 08:01 1234                       /usr/bin/sleep\n" +
		"7f0000000000-7f0000001000 r--p 00000000 08:01 99                         /home/u/work/my file\n" +
		"7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]\n"
	writeMaps(goodMaps)
	opened := func() *Opened {
		return &Opened{
			FDs:  map[int]string{3: "/home/u/work/data", 4: "/proc/100/status"},
			Maps: map[uint64]string{0x55d0c0000000: "/usr/bin/sleep", 0x7f0000000000: "/home/u/work/my file"},
			Exe:  "/usr/bin/sleep", Cwd: "/home/u/work", Root: "/",
		}
	}
	// In the image the process was PID 100 and read its own /proc/100/status; restored at
	// 4242 without a PID namespace of its own, it would hold 4242's: the test's made map
	// says 100 -> 4242, and the image's /proc path is checked against the restored PIDs.
	made := map[int]int{100: 4242}
	want := map[int]*Opened{100: opened()}
	want[100].FDs[4] = "/proc/4242/status"
	if err := CheckReopened(proc, procfs, want, made); err != nil {
		t.Fatalf("every file where it was: %v", err)
	}
	for _, tc := range []struct {
		name, link, to string
		maps           string
		wantErr        string
	}{
		{"a descriptor through a swapped directory", "fd/3", "/etc/shadow", "", "descriptor 3 was /home/u/work/data"},
		{"a descriptor gone", "fd/3", "", "", "descriptor 3"},
		{"the program", "exe", "/usr/bin/passwd", "", "program was /usr/bin/sleep"},
		{"the working directory", "cwd", "/etc", "", "working directory was /home/u/work"},
		{"the root", "root", "/tmp/x", "", "root was /"},
		{"a mapping", "", "", "7f0000000000-7f0000001000 r--p 00000000 08:01 7 /etc/shadow\n", "mapping at 0x7f0000000000"},
	} {
		if tc.link != "" {
			link(tc.link, tc.to)
		}
		if tc.maps != "" {
			writeMaps(tc.maps)
		}
		err := CheckReopened(proc, procfs, want, made)
		if !errors.Is(err, ErrReopenedElsewhere) || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: %v, want ErrReopenedElsewhere naming %q", tc.name, err, tc.wantErr)
		}
		if tc.link != "" {
			link(tc.link, whole[tc.link])
		}
		writeMaps(goodMaps)
	}
	// A /proc path of a process outside the restored tree names whoever has that PID now.
	want[100].FDs[4] = "/proc/77/mem"
	link("fd/4", "/proc/77/mem")
	if err := CheckReopened(proc, procfs, want, made); !errors.Is(err, ErrReopenedElsewhere) || !strings.Contains(err.Error(), "of process 77") {
		t.Errorf("a descriptor of /proc/77/mem: %v, want it refused", err)
	}
	// So does one in any other procfs: a chroot's procfs shows every process of the host.
	want[100].FDs[4] = "/srv/jail/proc/77/mem"
	link("fd/4", "/srv/jail/proc/77/mem")
	if err := CheckReopened(proc, procfs, want, made); !errors.Is(err, ErrReopenedElsewhere) || !strings.Contains(err.Error(), "of process 77") {
		t.Errorf("a descriptor of /srv/jail/proc/77/mem: %v, want it refused", err)
	}
}

// OpenedFiles lists what CRIU will reopen by path, read from a real dump: a named FIFO's
// descriptor (whose entry names the path through another entry), a regular file, the
// program and the working directory.
func TestOpenedFilesOfARealDump(t *testing.T) {
	dir := t.TempDir()
	fifo, data := filepath.Join(dir, "fifo"), filepath.Join(dir, "data")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	testutil.WriteFile(t, data, []byte("input"))
	// fd 3 the FIFO (read-write: no wait for a writer), fd 4 the file; cwd the directory.
	cmd := exec.Command("sh", "-c", "exec 3<>fifo 4<data; exec sleep 1000")
	cmd.Dir = dir
	pid, img := dumpWhenReady(t, cmd, func(pid int) bool {
		l, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/4")
		return l == data
	})
	opened, err := OpenedFiles(img)
	if err != nil {
		t.Fatal(err)
	}
	o := opened[pid]
	sleep, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
	if o == nil || o.FDs[3] != fifo || o.FDs[4] != data || o.Cwd != dir || o.Root != "/" || o.Exe != sleep {
		t.Fatalf("OpenedFiles = %+v, want fd 3 %s, fd 4 %s, cwd %s, root /, program %s", o, fifo, data, dir, sleep)
	}
	if err := CheckReopened("/proc", []string{"/proc"}, opened, map[int]int{pid: pid}); err != nil {
		t.Errorf("the dumped process itself, checked against its image: %v", err)
	}
}

// A process that had a /proc file of one of its own threads open gets it back: CRIU
// restores threads at their IDs, which are no process's PIDs.
func TestCheckReopenedTakesTheTreesThreads(t *testing.T) {
	self := os.Getpid()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	tid := 0
	for _, e := range tasks {
		if n, _ := strconv.Atoi(e.Name()); n != self {
			tid = n
		}
	}
	if tid == 0 {
		t.Skip("the test process has one thread")
	}
	proc := t.TempDir()
	fd := filepath.Join(proc, strconv.Itoa(self), "fd")
	if err := os.MkdirAll(fd, 0o755); err != nil {
		t.Fatal(err)
	}
	stat := "/proc/" + strconv.Itoa(tid) + "/stat"
	if err := os.Symlink(stat, filepath.Join(fd, "3")); err != nil {
		t.Fatal(err)
	}
	want := map[int]*Opened{1: {FDs: map[int]string{3: stat}}}
	if err := CheckReopened(proc, []string{"/proc"}, want, map[int]int{1: self}); err != nil {
		t.Fatalf("a thread's /proc file: %v", err)
	}
}

// A listening unix socket's directory swapped for a user's symlink after the checkpoint would
// have CRIU, as root, remove the socket at the symlink's target and bind the image's there:
// the image is refused before CRIU starts.
func TestCheckSocketDirsRefusesASwappedDirectory(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		testutil.SkipOrFail(t, "needs python3 for a process with a unix socket")
	}
	base := t.TempDir()
	d, other := filepath.Join(base, "d"), filepath.Join(base, "other")
	for _, p := range []string{d, other} {
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	sock := filepath.Join(d, "sock")
	cmd := exec.Command(py, "-c", "import socket,time\ns=socket.socket(socket.AF_UNIX)\ns.bind('"+sock+"')\ns.listen()\ntime.sleep(1000)")
	_, img := dumpWhenReady(t, cmd, func(int) bool { _, err := os.Stat(sock); return err == nil })
	if err := CheckSocketDirs(img); err != nil {
		t.Fatalf("the socket's directory as it was: %v", err)
	}
	if err := os.Rename(d, d+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(other, d); err != nil {
		t.Fatal(err)
	}
	// A symlink of root's, as /var/run is, is the host's own layout.
	if err := CheckSocketDirs(img); err != nil {
		t.Fatalf("the socket's directory a symlink of root's: %v", err)
	}
	if err := os.Lchown(d, 65534, 65534); err != nil { // a user swapped it
		t.Fatal(err)
	}
	if err := CheckSocketDirs(img); !errors.Is(err, ErrSocketUnderSymlink) || !strings.Contains(err.Error(), d) {
		t.Fatalf("the socket's directory swapped for a symlink: %v, want ErrSocketUnderSymlink", err)
	}
}
