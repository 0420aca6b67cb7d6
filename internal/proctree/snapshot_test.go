package proctree

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// A snapshot reads each thing once: what changes in procfs afterwards is not seen, so
// every check of one operation judges the same tree.
func TestSnapshotReadsOnce(t *testing.T) {
	root := t.TempDir()
	write := func(path, content string) {
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("7/maps", "7f00-7f10 rw-p 0 00:00 0\n")
	write("7/environ", "A=1\x00")
	write("7/task/7/comm", "main\n")
	write("7/task/8/comm", "worker\n")
	if err := os.MkdirAll(filepath.Join(root, "7", "fd"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/nvidiactl", filepath.Join(root, "7", "fd", "3")); err != nil {
		t.Fatal(err)
	}
	s := Snap(root, []Process{{PID: 7, Command: "python3"}})
	first := [4]string{string(s.Maps(7)), string(s.Environ(7))}
	files, err := s.Files(7)
	if err != nil || !slices.Equal(files, []string{"/dev/nvidiactl"}) || !slices.Equal(s.ThreadNames(7), []string{"main", "worker"}) {
		t.Fatalf("files %v, %v; threads %v", files, err, s.ThreadNames(7))
	}
	if err := os.RemoveAll(filepath.Join(root, "7")); err != nil {
		t.Fatal(err)
	}
	files, err = s.Files(7)
	if again := [4]string{string(s.Maps(7)), string(s.Environ(7))}; again != first || err != nil || len(files) != 1 || len(s.ThreadNames(7)) != 2 {
		t.Fatal("the snapshot read procfs again")
	}
	if s.Command(7) != "python3" || s.Command(8) != "" || len(s.Maps(9)) != 0 {
		t.Fatal("unknown processes must read as empty")
	}
}
