package memfill

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/gpucr/gpucr/internal/beneath"
)

// A Source is where a restore reads the memory it fills from: the image's own directory,
// or a store whose chunks are fetched as the fill needs them (chunked.Memory), so that the
// largest part of an image never has to sit on local disk.
type Source interface {
	// ReadAt fills p with the bytes of the image file at path (slash-separated, relative to
	// the image) from off. The fill reads in the image's hashing pieces (image.HashChunkSize,
	// aligned), so a source that verifies as it reads can hash each piece as it goes.
	ReadAt(ctx context.Context, path string, p []byte, off int64) error
	// Verify says, once the fill has read everything, whether what it read is the image's.
	Verify() error
}

// Dir is the Source of the image files in the local directory dir. The restore checks an
// image's local files itself, and holds the fill until they passed (the engine's
// verification): its Verify has nothing left to check.
func Dir(dir string) Source { return dirSource(dir) }

type dirSource string

func (d dirSource) ReadAt(_ context.Context, path string, p []byte, off int64) error {
	f, err := beneath.Open(string(d), filepath.FromSlash(path))
	if err != nil {
		return fmt.Errorf("memory fill: %w", err)
	}
	defer f.Close()
	// ReadAt reads all of p or fails: a short file is an error, io.EOF included.
	if _, err := f.ReadAt(p, off); err != nil {
		return fmt.Errorf("memory fill: read %s: %w", path, err)
	}
	return nil
}

func (dirSource) Verify() error { return nil }
