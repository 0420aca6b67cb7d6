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
