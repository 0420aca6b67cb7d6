package container

import (
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/internal/testutil"
)

// The bundle's owner can swap its path for a symlink of theirs and back while root's gpucr
// reads it: a check of the path's symlinks followed by an open by name let the open go
// through the symlink the check had not seen, to a root-only config.json (review). The
// swap goes on, by rename, while the spec is read again and again: never root's file.
func TestReadSpecRacesNoUsersSymlink(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "needs root: the symlink must be another user's")
	}
	secret, home := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(secret, "config.json"), []byte(`{"auths":"root's"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	bundle, swap := filepath.Join(home, "bundle"), filepath.Join(home, "swap")
	if err := os.Mkdir(bundle, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte(`{"ociVersion":"1.0.2"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, swap); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{home, bundle, filepath.Join(bundle, "config.json")} {
		if err := os.Chown(p, 1000, 1000); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Lchown(swap, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !stop.Load() {
			_ = unix.Renameat2(unix.AT_FDCWD, bundle, unix.AT_FDCWD, swap, unix.RENAME_EXCHANGE)
		}
	}()
	defer func() { stop.Store(true); <-done }()
	for end := time.Now().Add(500 * time.Millisecond); time.Now().Before(end); {
		if b, err := ReadSpec(bundle); err == nil && strings.Contains(string(b), "root's") {
			t.Fatalf("the spec read through the user's symlink: %s", b)
		}
	}
}
