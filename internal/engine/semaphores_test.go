package engine

import (
	"bytes"
	"errors"
	"fmt"
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
	if err := os.WriteFile(sem, files[0].Data, 0o600); err != nil {
		t.Fatal(err)
	}
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
	if err := os.WriteFile(sem, []byte("semaphorf"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = placeLinked(files, journal)
	if !errors.Is(err, ErrLinkedFileChanged) || !bytes.Contains([]byte(err.Error()), []byte("remove it if no process uses it")) {
		t.Fatalf("changed: %v, want %v", err, ErrLinkedFileChanged)
	}
	if _, err := os.Lstat(link); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("refused, a link was made: %v", err)
	}

	// CRIU's link name taken by another file: refused.
	if err := os.WriteFile(sem, files[0].Data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(link, files[0].Data, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err = placeLinked(files, journal); !errors.Is(err, ErrLinkedFileChanged) {
		t.Fatalf("link taken: %v, want %v", err, ErrLinkedFileChanged)
	}
}
