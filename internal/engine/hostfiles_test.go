package engine

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/image"
)

// openedAs opens a file of uid at path and returns this process's record of holding it.
func openedAs(t *testing.T, path string, uid int) *criuimg.Opened {
	t.Helper()
	if err := os.WriteFile(path, []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, uid, uid); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return &criuimg.Opened{FDs: map[int]string{int(f.Fd()): path}, Maps: map[uint64]string{}}
}

// A checkpoint records the owner of the file the process holds, not of what its path names
// by the time of the record: a user who swapped the file at the path in between had their
// own recorded as the job's (hostile test).
func TestHeldFilesAreWhatTheProcessHolds(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: files of another user")
	}
	path := filepath.Join(t.TempDir(), "data")
	o := openedAs(t, path, 0)
	if err := os.Rename(path, path+".away"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("them"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	held := heldFiles("/proc", os.Getpid(), o)
	if f, ok := held[path]; !ok || f.UID != 0 || f.Kind != "file" {
		t.Fatalf("held %+v: want the process's own file, root's", held)
	}
}

// A restore refuses, before any task runs, a file a restored process holds whose owner is
// not the recorded one: the check of its path before CRIU opened it could have seen another
// file than CRIU then opened (hostile test).
func TestCheckHeldRefusesAnotherOwnersFile(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: files of another user")
	}
	path := filepath.Join(t.TempDir(), "data")
	o := openedAs(t, path, 65534)
	want := map[int]*criuimg.Opened{7: o}
	made := map[int]int{7: os.Getpid()}
	recorded := []image.HostFile{{Path: path, UID: 0, Kind: "file"}}
	if err := checkHeld("/proc", want, made, recorded); !errors.Is(err, ErrFileChanged) {
		t.Fatalf("checkHeld of a file of uid 65534 recorded as root's = %v, want ErrFileChanged", err)
	}
	recorded[0].UID = 65534
	if err := checkHeld("/proc", want, made, recorded); err != nil {
		t.Fatalf("checkHeld of the recorded file: %v", err)
	}
}
