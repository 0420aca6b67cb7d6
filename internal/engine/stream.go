package engine

import (
	"context"
	"errors"
	"path"
	"slices"
	"sync"

	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/diskroom"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/memfill"
	"github.com/gpucr/gpucr/internal/txn"
)

// Streamed is a restore of an image whose memory gpucr saved itself is not in its
// directory but read from Memory as the fill needs it (a store's chunks): the directory
// holds only the image's other files, fetched for this restore.
type Streamed struct {
	// Memory serves the files of criuimg.MemDir. Its Verify, after the fill and before any
	// task resumes, is what proves them whole: they are never read before.
	Memory memfill.Source
	// Owned are paths made for this restore (the fetched files): journaled from its start,
	// so that a gpucr that dies leaves them to its recovery to remove.
	Owned []string
	// Room is the local disk the restore may still use beyond the fetched files: CRIU's
	// page files are copied without the long runs gpucr fills only when they fit in it.
	Room int64

	mu     sync.Mutex
	failed error // the first failure of Memory: what a failed restore reports
}

// localFiles are the files of the image that are in its directory: all but the streamed
// memory.
func (s *Streamed) localFiles(files []image.File) []image.File {
	if s == nil {
		return files
	}
	var out []image.File
	for _, f := range files {
		if path.Dir(f.Path) != criuimg.MemDir {
			out = append(out, f)
		}
	}
	return out
}

// memory is where the fill reads the memory gpucr saved in the image at dir; the local
// files in check are verified as the fill reads them.
func (s *Streamed) memory(dir string, check []image.File) memfill.Source {
	if s == nil {
		return memfill.CheckedDir(dir, check)
	}
	return recording{s}
}

// prefer returns the first failure of the streamed memory, if any, else err: the fill runs
// inside CRIU's restore, which reports only that a step failed.
func (s *Streamed) prefer(err error) error {
	if s == nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed != nil {
		return s.failed
	}
	return err
}

func (s *Streamed) record(err error) error {
	if err != nil && !errors.Is(err, context.Canceled) {
		s.mu.Lock()
		if s.failed == nil {
			s.failed = err
		}
		s.mu.Unlock()
	}
	return err
}

// recording is the Memory of s, whose failures s keeps.
type recording struct{ s *Streamed }

func (r recording) ReadPiece(ctx context.Context, path string, off int64, p []byte, use func(at int, part []byte) error) error {
	return r.s.record(r.s.Memory.ReadPiece(ctx, path, off, p, use))
}

func (r recording) Verify() error { return r.s.record(r.s.Memory.Verify()) }

// beginRestore begins a restore of target, journaling with it the paths a streamed restore
// owns and the others it names (a private copy of the image).
func (e *Engine) beginRestore(target RestoreTarget, s *Streamed, others ...string) (*Op, error) {
	owned := others
	if s != nil {
		owned = append(slices.Clone(s.Owned), others...)
	}
	return e.begin(txn.OpRestore, target.What(), owned, target.Locks()...)
}

// splitFits reports whether the copy of CRIU's page files that splitting them makes stays
// within the local disk a streamed restore may use; a local restore has no such bound.
func (s *Streamed) splitFits(m *image.Manifest, work string) bool {
	if s == nil {
		return true
	}
	var pages int64
	for _, f := range m.Files {
		if path.Dir(f.Path) != criuimg.MemDir && criuimg.IsPagesName(path.Base(f.Path)) {
			pages += f.Size
		}
	}
	return pages <= s.Room && diskroom.Check(work, pages) == nil
}
