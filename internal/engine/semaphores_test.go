package engine

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/safety"
)

// A restore makes a carried semaphore's file and CRIU's link to it before CRIU runs, and
// undoes both if it fails; a file there with other bytes (the job, or an earlier restore,
// ran on) is refused, and nothing is made.
func TestPlaceLinkedMakesOrRefuses(t *testing.T) {
	name := fmt.Sprintf("sem.gpucr-test-%d", os.Getpid())
	remap := fmt.Sprintf("link_remap.%d", 900000000+os.Getpid())
	sem, link := filepath.Join(safety.ShmDir, name), filepath.Join(safety.ShmDir, remap)
	t.Cleanup(func() { os.Remove(sem); os.Remove(link) })
	files := []image.LinkedFile{{Path: sem, Remap: remap, Mode: 0o640, UID: 1, GID: 2, Data: []byte("semaphore")}}
	var journaled []string
	journal := func(p []string) error { journaled = append(journaled, p...); return nil }

	undo, err := placeLinked(files, journal)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(link)
	if err != nil || !bytes.Equal(b, files[0].Data) || len(journaled) != 1 || journaled[0] != link {
		t.Fatalf("link: %q, %v; journaled %v", b, err, journaled)
	}
	fi, err := os.Stat(sem)
	if err != nil || fi.Mode().Perm() != 0o640 || fi.Sys().(*syscall.Stat_t).Uid != 1 {
		t.Fatalf("file: %v, %v", fi, err)
	}
	if err := undo(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(sem); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("undone, the file made is still there: %v", err)
	}

	// The file there, as it was: only the link is made.
	writeAs(t, sem, files[0])
	undo, err = placeLinked(files, journal)
	if err != nil {
		t.Fatal(err)
	}
	if err := undo(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(link); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("undone, the link is still there: %v", err)
	}
	if _, err := os.Lstat(sem); err != nil {
		t.Fatalf("undone, the file it did not make is gone: %v", err)
	}

	// Changed since: refused, with what to do.
	writeAs(t, sem, image.LinkedFile{Mode: 0o640, UID: 1, GID: 2, Data: []byte("semaphorf")})
	_, err = placeLinked(files, journal)
	if !errors.Is(err, ErrLinkedFileChanged) || !bytes.Contains([]byte(err.Error()), []byte("remove it if no process uses it")) {
		t.Fatalf("changed: %v, want %v", err, ErrLinkedFileChanged)
	}
	if _, err := os.Lstat(link); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("refused, a link was made: %v", err)
	}

	// CRIU's link name taken by another file: refused.
	writeAs(t, sem, files[0])
	if err := os.WriteFile(link, files[0].Data, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err = placeLinked(files, journal); !errors.Is(err, ErrLinkedFileChanged) {
		t.Fatalf("link taken: %v, want %v", err, ErrLinkedFileChanged)
	}
}

// writeAs writes path with f's bytes, owner and mode.
func writeAs(t *testing.T, path string, f image.LinkedFile) {
	t.Helper()
	if err := os.WriteFile(path, f.Data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, int(f.UID), int(f.GID)); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, fs.FileMode(f.Mode)); err != nil {
		t.Fatal(err)
	}
}

// A file at the semaphore's name with the image's bytes but another owner or mode is
// another user's, made before the restore (the name is in /dev/shm for all to see): linked
// to, the restored job would map a file its maker can still write (hostile test). It is
// refused, and nothing is linked to it.
func TestPlaceLinkedRefusesAnotherOwnersFile(t *testing.T) {
	name := fmt.Sprintf("sem.gpucr-test-owner-%d", os.Getpid())
	remap := fmt.Sprintf("link_remap.%d", 910000000+os.Getpid())
	sem, link := filepath.Join(safety.ShmDir, name), filepath.Join(safety.ShmDir, remap)
	t.Cleanup(func() { os.Remove(sem); os.Remove(link) })
	files := []image.LinkedFile{{Path: sem, Remap: remap, Mode: 0o600, UID: 1, GID: 2, Data: []byte("semaphore")}}
	journal := func([]string) error { return nil }
	for _, c := range []struct {
		what     string
		uid, gid int
		mode     os.FileMode
	}{
		{"another user's", 65534, 2, 0o600},
		{"another group's", 1, 65534, 0o600},
		{"writable by all", 1, 2, 0o666},
	} {
		if err := os.WriteFile(sem, files[0].Data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(sem, c.uid, c.gid); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(sem, c.mode); err != nil {
			t.Fatal(err)
		}
		undo, err := placeLinked(files, journal)
		if err == nil {
			_ = undo()
		}
		if !errors.Is(err, ErrLinkedFileChanged) {
			t.Errorf("%s file: %v, want %v", c.what, err, ErrLinkedFileChanged)
		}
		if _, err := os.Lstat(link); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s file: a link was made to it: %v", c.what, err)
		}
		os.Remove(sem)
	}
}

// A restore that fails after its CRIU took the link (CRIU removes it as it opens the file)
// removes only what it made: another restore of another job, whose image names the same
// link_remap.N (CRIU numbers them by the file's id, alike for jobs alike), may have made
// the name again since, for its own CRIU (hostile test: two such jobs restored at once).
func TestPlaceLinkedUndoesOnlyWhatItMade(t *testing.T) {
	name := fmt.Sprintf("sem.gpucr-test-undo-%d", os.Getpid())
	remap := fmt.Sprintf("link_remap.%d", 920000000+os.Getpid())
	sem, link := filepath.Join(safety.ShmDir, name), filepath.Join(safety.ShmDir, remap)
	other := sem + "-other"
	t.Cleanup(func() { os.Remove(sem); os.Remove(link); os.Remove(other) })
	files := []image.LinkedFile{{Path: sem, Remap: remap, Mode: 0o600, Data: []byte("semaphore")}}
	undo, err := placeLinked(files, func([]string) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	// This restore's CRIU took its link and the job's file went; another restore made both
	// names again for its job.
	for _, p := range []string{link, sem} {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(other, []byte("another job's"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(other, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(other, sem); err != nil {
		t.Fatal(err)
	}
	if err := undo(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{link, sem} {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("undone, another restore's %s is gone: %v", p, err)
		}
	}
}
