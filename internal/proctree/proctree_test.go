package proctree

import (
	"errors"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"testing"
	"time"
)

func TestTreeFindsChildrenOfARealTree(t *testing.T) {
	cmd := exec.Command("sh", "-c", "sleep 30 & sleep 30 & wait")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = exec.Command("pkill", "-P", strconv.Itoa(cmd.Process.Pid)).Run()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	var tree []Process
	for i := 0; i < 100; i++ { // the shell forks its children asynchronously
		var err error
		if tree, err = Tree(cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
		// The shell forks first and execs sleep after: wait for both children to be sleep.
		if len(tree) == 3 && tree[1].Command == "sleep" && tree[2].Command == "sleep" {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(tree) != 3 {
		t.Fatalf("tree of %d has %d processes, want 3: %+v", cmd.Process.Pid, len(tree), tree)
	}
	if tree[0].PID != cmd.Process.Pid || tree[0].Command != "sh" {
		t.Errorf("root = %+v", tree[0])
	}
	for _, p := range tree[1:] {
		if p.PPID != cmd.Process.Pid || p.Command != "sleep" || p.Threads != 1 {
			t.Errorf("child = %+v", p)
		}
	}
}

func TestMissingProcess(t *testing.T) {
	if _, err := Tree(1 << 30); !errors.Is(err, ErrNoProcess) {
		t.Fatalf("Tree(huge pid) = %v, want ErrNoProcess", err)
	}
	if _, err := Read(1 << 30); !errors.Is(err, ErrNoProcess) {
		t.Fatalf("Read(huge pid) = %v, want ErrNoProcess", err)
	}
	self, err := Read(os.Getpid())
	if err != nil || self.Threads < 1 {
		t.Fatalf("Read(self) = %+v, %v", self, err)
	}
}

func TestOpenFiles(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "held")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files, err := OpenFiles("/proc", os.Getpid())
	if err != nil || !slices.Contains(files, f.Name()) {
		t.Fatalf("OpenFiles(self) = %v, %v; want it to hold %s", files, err, f.Name())
	}
	if files, err := OpenFiles("/proc", 1<<30); files != nil || err != nil {
		t.Fatalf("OpenFiles(gone) = %v, %v; want none", files, err)
	}
}

// Holding names the processes with a file open beneath a directory, by the path a
// descriptor shows: in a mount namespace of its own a process can show any path (a tmpfs
// mounted at the directory's name), and a descriptor of such a file passed back into this
// namespace shows it too; each is counted only for files on the directory's own file system
// (a CRIU that made a mount namespace of its own to restore a container counts).
func TestHoldingCountsOnlyTheDirectorysFiles(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a mount namespace of its own")
	}
	dir := t.TempDir()
	start := func(name string, args ...string) int {
		t.Helper()
		c := exec.Command(name, args...)
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
		return c.Process.Pid
	}
	ours := start("sh", "-c", "exec 3>"+dir+"/ours; exec sleep 60")
	theirs := start("unshare", "--mount", "--propagation", "private", "sh", "-c",
		"mount -t tmpfs none "+dir+" && exec 3>"+dir+"/theirs && exec sleep 60")
	criu := start("unshare", "--mount", "--propagation", "private", "sh", "-c", "exec 3>"+dir+"/criu; exec sleep 60")
	// A tmpfs file's descriptor carried back into this mount namespace, as one passed over a
	// unix socket would be: out of reach of this namespace's root, it shows its path from
	// the tmpfs's own root, where the directory's path was made.
	passed := start("unshare", "--mount", "--propagation", "private", "sh", "-c",
		"mount -t tmpfs none /mnt && mkdir -p /mnt"+dir+" && exec 3>/mnt"+dir+"/passed && exec nsenter --mount=/proc/"+strconv.Itoa(os.Getpid())+"/ns/mnt sleep 60")
	// The same with a bind mount of another directory of the directory's own file system.
	other := t.TempDir()
	bound := start("unshare", "--mount", "--propagation", "private", "sh", "-c",
		"mount --bind "+other+" /mnt && mkdir -p /mnt"+dir+" && exec 3>/mnt"+dir+"/bound && exec nsenter --mount=/proc/"+strconv.Itoa(os.Getpid())+"/ns/mnt sleep 60")
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		a, _ := OpenFiles("/proc", ours)
		b, _ := OpenFiles("/proc", theirs)
		c, _ := OpenFiles("/proc", criu)
		d, _ := OpenFiles("/proc", passed)
		e, _ := OpenFiles("/proc", bound)
		back, _ := OwnNamespace(passed, "mnt")
		boundBack, _ := OwnNamespace(bound, "mnt")
		if slices.Contains(a, dir+"/ours") && slices.Contains(b, dir+"/theirs") && slices.Contains(c, dir+"/criu") &&
			slices.Contains(d, dir+"/passed") && !back && slices.Contains(e, dir+"/bound") && !boundBack {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the holders did not open their files: %v, %v, %v, %v, %v", a, b, c, d, e)
		}
	}
	held, err := Holding(dir)
	if err != nil || !slices.Contains(held, ours) || slices.Contains(held, theirs) || !slices.Contains(held, criu) || slices.Contains(held, passed) || slices.Contains(held, bound) {
		t.Fatalf("Holding = %v, %v; want %d and %d (the directory's own files) and none of %d, %d (a tmpfs at its name), %d (a bind mount of another directory)",
			held, err, ours, criu, theirs, passed, bound)
	}
}
