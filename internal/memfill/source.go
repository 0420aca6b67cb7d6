package memfill

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"

	"github.com/gpucr/gpucr/internal/beneath"
	"github.com/gpucr/gpucr/internal/image"
)

// A Source is where a restore reads the memory it fills from: the image's own directory,
// or a store whose chunks are fetched as the fill needs them (chunked.Memory), so that the
// largest part of an image never has to sit on local disk.
type Source interface {
	// ReadPiece reads len(buf) bytes of the image file at path (slash-separated, relative
	// to the image) from off, all of them or an error, and hands them to use part by part,
	// in order, each as soon as it is read: the fill writes a part into the process while it
	// is still in the core's cache. A part lies in buf or in the source's own memory (a
	// store's chunk where it arrived), and only for the call. The fill reads in the image's
	// hashing pieces (image.HashChunkSize, aligned), so a source that verifies as it reads
	// can hash each piece as it goes.
	ReadPiece(ctx context.Context, path string, off int64, buf []byte, use func(at int, part []byte) error) error
	// Verify says, once the fill has read everything, whether what it read is the image's.
	Verify() error
}

// Dir is the Source of the image files in the local directory dir. The restore checks an
// image's local files itself, and holds the fill until they passed (the engine's
// verification): its Verify has nothing left to check.
func Dir(dir string) Source { return dirSource(dir) }

type dirSource string

func (d dirSource) ReadPiece(_ context.Context, path string, off int64, buf []byte, use func(at int, part []byte) error) error {
	f, err := beneath.Open(string(d), filepath.FromSlash(path))
	if err != nil {
		return fmt.Errorf("memory fill: %w", err)
	}
	defer f.Close()
	for at := 0; at < len(buf); at += step {
		part := buf[at:min(at+step, len(buf))]
		// ReadAt reads all of part or fails: a short file is an error, io.EOF included.
		if _, err := f.ReadAt(part, off+int64(at)); err != nil {
			return fmt.Errorf("memory fill: read %s: %w", path, err)
		}
		if err := use(at, part); err != nil {
			return err
		}
	}
	return nil
}

func (dirSource) Verify() error { return nil }

// CheckedDir is Dir for an image whose files in check are not verified yet: each piece the
// fill reads of them is hashed while it is in cache, and Verify compares each file's
// checksum with the manifest's. The fill then verifies gpucr's own memory files itself, and
// no second pass over nearly all of the image holds it up. A file the fill did not read
// whole, in aligned pieces, is read again by Verify.
func CheckedDir(dir string, check []image.File) Source {
	c := &checkedDir{dir: dirSource(dir), files: map[string]*image.FileReads{}}
	for _, f := range check {
		c.files[f.Path] = image.NewFileReads(f)
	}
	return c
}

type checkedDir struct {
	dir   dirSource
	files map[string]*image.FileReads // workers record distinct pieces; Verify runs after them
}

func (c *checkedDir) ReadPiece(ctx context.Context, path string, off int64, buf []byte, use func(at int, part []byte) error) error {
	f, ok := c.files[path]
	k, whole := 0, false
	if ok {
		k, whole = f.Piece(off, int64(len(buf)))
	}
	if !whole {
		return c.dir.ReadPiece(ctx, path, off, buf, use)
	}
	h := image.NewPieceHash(f.File.Strong())
	err := c.dir.ReadPiece(ctx, path, off, buf, func(at int, part []byte) error {
		h.Add(part)
		return use(at, part)
	})
	if err != nil {
		return err
	}
	f.Record(k, h.Sum())
	return nil
}

func (c *checkedDir) Verify() error {
	var again []image.File
	for _, path := range slices.Sorted(maps.Keys(c.files)) {
		f := c.files[path]
		if !f.Whole() {
			again = append(again, f.File)
			continue
		}
		if err := f.Check(); err != nil {
			return err
		}
	}
	if len(again) > 0 {
		return image.CheckSums(string(c.dir), again)
	}
	return nil
}
