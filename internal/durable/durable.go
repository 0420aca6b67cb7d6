// Package durable makes file system changes survive a crash: images, stores and pulls all
// promise that what they report written is on disk, and share this one way of keeping it.
package durable

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// SyncDir makes dir's entries (a rename, a link, a new file) durable. Filesystems that
// cannot fsync a directory (EINVAL) have nothing more to do.
func SyncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
