package chunked

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A push opens the image's files without following a symlink and without waiting on a
// FIFO: whoever can write the image may have swapped one since it was verified (a hostile
// test had a push upload a root-only file to the store so).
func TestPushOpensNoSymlinkNorFIFO(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("root's"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(dir, "link.img")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(dir, "fifo.img"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"link.img", "fifo.img"} {
		done := make(chan error, 1)
		go func() {
			h, err := holdFiles(dir, []string{name})
			if err == nil {
				h.close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil {
				t.Errorf("a push opened %s", name)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("a push waits on %s", name)
		}
	}
}

// The pagemaps that say where a pages file's chunks end were opened again by path once the
// files were held: a FIFO swapped in after verification held root's push for good
// (review). They are read from the files held.
func TestPageCutsReadTheHeldPagemap(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "criu"), 0o700); err != nil {
		t.Fatal(err)
	}
	pm := filepath.Join(dir, "criu", "pagemap-1.img")
	if err := os.WriteFile(pm, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	h, err := holdFiles(dir, []string{"criu/pagemap-1.img"})
	if err != nil {
		t.Fatal(err)
	}
	defer h.close()
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(fifo, pm); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		pageCuts(h, []File{{Path: "criu/pages-1.img", Size: 4096}})
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("pageCuts waits on a FIFO swapped in for the pagemap it held")
	}
}
