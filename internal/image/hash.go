package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/internal/beneath"
	"github.com/gpucr/gpucr/internal/parallel"
)

// HashChunkSize is the unit of hashing. A file's checksum is the xxh64 of its chunks' xxh64
// digests in order, so one large page file is hashed on all cores at once: a 17 GB image
// took 5 s to checksum whole on one core, and the commit and verify of every image wait on it.
// It is part of the image format (every recorded checksum depends on it), unlike the
// chunked store's chunked.ChunkSize, its unit of deduplication, which is free to differ.
const HashChunkSize = 8 << 20

// sumFiles sizes and hashes paths (slash, relative to dir) on all cores and returns them in
// the order of paths; strong(i) says whether the i-th gets its SHA-256 too. Commit and
// Verify share it so that both compute the same thing. With durable, each file is also
// fsynced, in parallel. The first error, or ctx's end, stops the work and is returned.
func sumFiles(ctx context.Context, dir string, paths []string, durable bool, strong func(i int) bool) ([]File, error) {
	files := make([]*os.File, len(paths))
	sizes := make([]int64, len(paths))
	defer func() {
		for _, f := range files {
			if f != nil {
				f.Close()
			}
		}
	}()
	type chunk struct{ file, index int }
	var chunks []chunk
	pieces := make([][]Piece, len(paths))
	for i, p := range paths {
		f, err := beneath.Open(dir, filepath.FromSlash(p))
		if err != nil {
			return nil, fmt.Errorf("checksum %s: %w", p, err)
		}
		files[i] = f
		fi, err := f.Stat()
		if err != nil {
			return nil, fmt.Errorf("checksum %s: %w", p, err)
		}
		sizes[i] = fi.Size()
		n := int((fi.Size() + HashChunkSize - 1) / HashChunkSize)
		pieces[i] = make([]Piece, n)
		for j := range n {
			chunks = append(chunks, chunk{i, j})
		}
	}

	workers := runtime.GOMAXPROCS(0)
	err := parallel.Each(ctx, chunks, workers, func() []byte { return make([]byte, HashChunkSize) },
		func(_ context.Context, c chunk, buf []byte) error {
			off := int64(c.index) * HashChunkSize
			if size := min(HashChunkSize, sizes[c.file]-off); InHole(files[c.file], off, size) {
				pieces[c.file][c.index] = zeroPiece(size, strong(c.file))
				return nil
			}
			n, err := files[c.file].ReadAt(buf, off)
			if err != nil && !errors.Is(err, io.EOF) {
				return fmt.Errorf("checksum %s: %w", paths[c.file], err)
			}
			pieces[c.file][c.index] = SumPiece(buf[:n], strong(c.file))
			return nil
		})
	if err != nil {
		return nil, err
	}
	if durable {
		err := parallel.Each(ctx, files, workers, func() struct{} { return struct{}{} },
			func(_ context.Context, f *os.File, _ struct{}) error {
				if err := f.Sync(); err != nil {
					return fmt.Errorf("sync %s: %w", f.Name(), err)
				}
				return nil
			})
		if err != nil {
			return nil, err
		}
	}
	out := make([]File, len(paths))
	for i, p := range paths {
		out[i] = FileOf(p, sizes[i], pieces[i], strong(i))
	}
	return out, nil
}

// InHole says whether the n bytes of f from off lie in a hole, which reads as zeros: the
// memory gpucr saves leaves its zero pieces so, and hashing them need not read them (nor
// can a sparse file listed as terabytes make a check read terabytes). A file system that
// keeps no holes says there is data everywhere.
func InHole(f *os.File, off, n int64) bool {
	next, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
	return err == unix.ENXIO || (err == nil && next >= off+n)
}

// zeroPieces are the digests of a whole piece of zeros, taken once.
var zeroPieces = sync.OnceValues(func() (Piece, Piece) {
	zeros := make([]byte, HashChunkSize)
	return SumPiece(zeros, false), SumPiece(zeros, true)
})

// zeroPiece is the digests of a piece of n zeros (n at most HashChunkSize).
func zeroPiece(n int64, strong bool) Piece {
	if n < HashChunkSize {
		return SumPiece(make([]byte, n), strong)
	}
	weak, full := zeroPieces()
	if strong {
		return full
	}
	return weak
}

// Summer computes the checksums of a file from its bytes in order, the same ones Commit
// computes from the file itself: for files that pass through gpucr on their way to a store
// and are never written locally.
type Summer struct {
	h      *PieceHash
	strong bool
	n      int64 // bytes in the current piece
	size   int64
	pieces []Piece
}

// NewSummer starts the checksums of an empty file; strong adds its SHA-256 (a signed image).
func NewSummer(strong bool) *Summer { return &Summer{h: NewPieceHash(strong), strong: strong} }

// Write adds the next bytes of the file; it never fails.
func (s *Summer) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := min(int64(len(p)), HashChunkSize-s.n)
		s.h.Add(p[:k])
		s.n += k
		s.size += k
		p = p[k:]
		if s.n == HashChunkSize {
			s.pieces = append(s.pieces, s.h.Sum())
			s.h.Reset()
			s.n = 0
		}
	}
	return n, nil
}

// Piece returns the digests of piece k, once its last byte was written, and whether they
// include its SHA-256.
func (s *Summer) Piece(k int64) (Piece, bool, bool) {
	if k < 0 || k >= int64(len(s.pieces)) {
		return Piece{}, false, false
	}
	return s.pieces[k], s.strong, true
}

// File is the manifest entry of the file at path with the bytes written so far.
func (s *Summer) File(path string) File {
	pieces := s.pieces
	if s.n > 0 {
		pieces = append(slices.Clip(pieces), s.h.Sum())
	}
	return FileOf(path, s.size, pieces, s.strong)
}
