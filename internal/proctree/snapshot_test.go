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

// A held file's path is read through the descriptor its stat is read through: read by
// name through the process's link, one after the other, a descriptor the process closed
// and reused in between paired a deleted file's path with another file's link count
// (crash test). The link here leads on through a second name, as a reused descriptor
// leads elsewhere than the path read a moment before.
func TestHeldFilesPairAPathWithItsOwnFile(t *testing.T) {
	root, dir := t.TempDir(), t.TempDir()
	file := filepath.Join(dir, "b")
	if err := os.WriteFile(file, []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(file, filepath.Join(dir, "a (deleted)")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "7", "fd"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "a (deleted)"), filepath.Join(root, "7", "fd", "3")); err != nil {
		t.Fatal(err)
	}
	held := Snap(root, []Process{{PID: 7}}).HeldFiles(7, func(Held) bool { return true })
	if len(held) != 1 || held[0].Path != file || held[0].FD != 3 || held[0].Links() != 1 {
		t.Fatalf("held %+v: want %s at fd 3, one link", held, file)
	}
}
