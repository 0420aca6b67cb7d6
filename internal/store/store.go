// Package store keeps objects by key in a local directory or in S3-compatible object
// storage, behind one small interface, so that images can travel between machines without
// the code that chunks them knowing where they go.
package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"syscall"
	"time"
)

// Errors callers act on; every backend returns them wrapped with the key.
var (
	ErrNotFound = errors.New("object not found")
	// ErrNotObject is a local store's name that is there but no object gpucr reads (a
	// symbolic link, a device): read as not found, yet not absent, which a collection must
	// not take it for.
	ErrNotObject error = notObject{}
	// ErrExists is Create finding the key taken: a concurrent writer got there first.
	ErrExists = errors.New("object already exists")
	// ErrFull is a service refusing a write for want of room; a local directory's is the
	// file system's ENOSPC or EDQUOT instead (Full tells either).
	ErrFull = errors.New("the store is full")
)

type notObject struct{}

func (notObject) Error() string { return "not a regular file (gpucr follows no symbolic link)" }

// Is makes a name that is no object read as one not found, to those who only read.
func (notObject) Is(target error) bool { return target == ErrNotFound }

// Full reports whether err is a store refusing a write for want of room.
func Full(err error) bool {
	return errors.Is(err, ErrFull) || errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// Store holds objects by key. Keys are slash-separated paths without a leading slash; a
// key's last element is its name and what comes before is its "directory", as in S3.
// Every write is atomic: an object is absent or whole, never partial, which is what lets a
// checkpoint be complete exactly when its manifest object exists.
type Store interface {
	// Put stores data at key, replacing any object there. Objects are chunks, manifests and
	// leases, each in memory whole: a service is sent it in one request, checksummed first.
	Put(ctx context.Context, key string, data []byte) error
	// Create is Put that fails with ErrExists instead of replacing an object.
	Create(ctx context.Context, key string, data []byte) error
	// Get streams the object at key; ErrNotFound if there is none.
	Get(ctx context.Context, key string) (io.ReadCloser, error)
	// Stat returns the size of the object at key; ErrNotFound if there is none.
	Stat(ctx context.Context, key string) (int64, error)
	// List returns what is directly under the directory dir ("" for the top), sorted by key.
	List(ctx context.Context, dir string) ([]Entry, error)
	// Delete removes the object at key; a missing object is not an error.
	Delete(ctx context.Context, key string) error
	// URL names key for messages, e.g. s3://bucket/key or /srv/images/key.
	URL(key string) string
}

// Shared is a Store that can tell whether users other than this process's (and root) could
// write what it holds under dir: a push then checks a chunk it finds already stored before
// it reuses it, since such a user could have put other bytes under the chunk's name.
type Shared interface {
	OthersCanWrite(dir string) bool
}

// Checksummed is a Store that sends each object with its CRC32C for the service to check
// (S3). A caller that took the CRC32C while it built the object, its bytes still in the
// core's cache, gives it to PutChecked and spares the store another pass over them.
type Checksummed interface {
	PutChecked(ctx context.Context, key string, data []byte, crc32c uint32) error
}

// PartialLister is a Store whose interrupted writes leave pieces behind: a Dir's
// temporary files (an S3 object is written whole or not at all).
type PartialLister interface {
	// Partial lists the pieces of writes directly under dir, finished or not: only a
	// caller that knows no write is in progress there may Delete them.
	Partial(ctx context.Context, dir string) ([]Entry, error)
}

// ListingGuard is a Store whose listings a user other than the caller may be able to change
// by renaming what a directory holds (a local directory). A collection deletes the chunks no
// listed checkpoint references, so a checkpoint renamed out of sight would lose its chunks
// to it: it asks the store first.
type ListingGuard interface {
	// TrustListing fails unless no one but the caller (when root: root alone) can rename
	// what dir holds; a dir that does not exist holds nothing.
	TrustListing(dir string) error
}

// Entry is one name directly under a listed directory: an object, or a directory (Dir)
// holding more.
type Entry struct {
	Key  string // full key; a directory's has no trailing slash
	Dir  bool
	Size int64
	// Modified is when the object was last written, by the store's clock; zero for a
	// directory.
	Modified time.Time
}

// Name is the entry's last key element.
func (e Entry) Name() string { return path.Base(e.Key) }

// checkKey refuses keys that would escape a directory store or that S3 would store under
// a different name than the one asked for.
func checkKey(key string) error {
	if key == "" || strings.HasPrefix(key, "/") || path.Clean(key) != key || key == "." || key == ".." ||
		strings.HasPrefix(key, "../") {
		return fmt.Errorf("invalid object key %q", key)
	}
	return nil
}

// checkDir is checkKey for List's directory, which may be the top ("").
func checkDir(dir string) error {
	if dir == "" {
		return nil
	}
	return checkKey(dir)
}
