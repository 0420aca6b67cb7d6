package engine

import (
	"path"

	"github.com/gpucr/gpucr/internal/criuimg"
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

// memory is where the fill reads the memory gpucr saved in the image at dir.
func (s *Streamed) memory(dir string) memfill.Source {
	if s == nil {
		return memfill.Dir(dir)
	}
	return s.Memory
}

// beginRestore begins a restore of target, journaling the paths a streamed restore owns
// with it.
func (e *Engine) beginRestore(target RestoreTarget, s *Streamed) (*Op, error) {
	var owned []string
	if s != nil {
		owned = s.Owned
	}
	return e.begin(txn.OpRestore, target.What(), owned, target.Locks()...)
}
