package criuimg

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/hwbreak"
	"github.com/gpucr/gpucr/internal/testutil"
)

// dumpTree starts `sleep 1000 & exec sleep 1000` in a new session with no
// terminal, dumps it with the criu CLI and returns the image directory and
// the root's PID. CRIU kills the tree after a successful dump.
func dumpTree(t *testing.T) (string, int) {
	t.Helper()
	criu := os.Getenv("GPUCR_CRIU")
	if criu == "" {
		criu = "/opt/gpucr/criu/sbin/criu"
	}
	_, err := os.Stat(criu)
	if err != nil || os.Geteuid() != 0 {
		testutil.SkipOrFail(t, fmt.Sprintf("need root and criu at %s (euid %d, %v)", criu, os.Geteuid(), err))
	}

	// Nil Stdin/Stdout/Stderr: os/exec connects them to /dev/null.
	cmd := exec.Command("sh", "-c", "sleep 1000 & exec sleep 1000")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() {
		// The group is still held by pid until Wait reaps it, so it cannot
		// have been reused.
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})

	// sh forks the background sleep before it execs, so once the root's
	// comm is "sleep" both processes exist.
	deadline := time.Now().Add(10 * time.Second)
	for {
		comm, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
		if string(comm) == "sleep\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d never became sleep (comm %q)", pid, comm)
		}
		time.Sleep(10 * time.Millisecond)
	}

	dir := t.TempDir()
	out, err := hwbreak.Command(criu, "dump", "-t", strconv.Itoa(pid), "-D", dir, "-v1", "-o", "dump.log").CombinedOutput()
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "dump.log"))
		t.Fatalf("criu dump: %v\n%s\n%s", err, out, log)
	}
	return dir, pid
}

func TestReadRealDump(t *testing.T) {
	dir, pid := dumpTree(t)
	s, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}

	if len(s.Processes) != 2 {
		t.Fatalf("got %d processes, want 2: %+v", len(s.Processes), s.Processes)
	}
	root, child := s.Processes[0], s.Processes[1]
	if root.PID != pid || root.PPID != 0 || root.Command != "sleep" || root.Threads != 1 {
		t.Errorf("root = %+v, want pid %d, ppid 0, command sleep, 1 thread", root, pid)
	}
	if child.PPID != pid || child.Command != "sleep" || child.Threads != 1 {
		t.Errorf("child = %+v, want ppid %d, command sleep, 1 thread", child, pid)
	}

	// The pagemap head must not be counted: the pages CRIU wrote to the
	// pages-*.img files are exactly the pages the pagemaps list.
	written, err := filepath.Glob(filepath.Join(dir, "pages-*.img"))
	if err != nil {
		t.Fatal(err)
	}
	var size uint64
	for _, name := range written {
		fi, err := os.Stat(name)
		if err != nil {
			t.Fatal(err)
		}
		size += uint64(fi.Size())
	}
	if s.MemoryBytes == 0 || s.MemoryBytes != root.MemoryBytes+child.MemoryBytes || s.MemoryBytes != size {
		t.Errorf("memory: total %d, root %d, child %d, pages-*.img hold %d bytes",
			s.MemoryBytes, root.MemoryBytes, child.MemoryBytes, size)
	}

	for _, p := range s.Processes {
		if p.MemoryBytes == 0 {
			t.Errorf("process %d: no memory", p.PID)
		}
		got := map[int]OpenFile{}
		for _, f := range p.Files {
			got[f.FD] = f
		}
		for fd := range 3 {
			if f := got[fd]; f.Type != "reg" || f.Path != "/dev/null" {
				t.Errorf("process %d fd %d = %+v, want reg /dev/null; files %+v", p.PID, fd, f, p.Files)
			}
		}
	}
}

func TestReadNotAnImage(t *testing.T) {
	_, err := Read(t.TempDir())
	if err == nil || !errors.Is(err, fs.ErrNotExist) || !strings.HasPrefix(err.Error(), "read pstree.img: ") {
		t.Fatalf("Read(empty dir) = %v, want a missing pstree.img error", err)
	}
}
