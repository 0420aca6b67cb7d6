package chunked

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/internal/store"
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
	up, err := newUploader(context.Background(), store.NewDir(t.TempDir()), "ckpt", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer up.close()
	for _, name := range []string{"link.img", "fifo.img"} {
		done := make(chan error, 1)
		go func() {
			p, err := newPusher(up, dir, []string{name}, Options{})
			if err == nil {
				p.close()
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
