package image

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"

	"github.com/cespare/xxhash/v2"

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
// the order of paths. Commit and Verify share it so that both compute the same thing. With
// durable, each file is also fsynced, in parallel. The first error, or ctx's end, stops the
// work and is returned.
func sumFiles(ctx context.Context, dir string, paths []string, durable bool) ([]File, error) {
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
	digests := make([][]uint64, len(paths))
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
		digests[i] = make([]uint64, n)
		for j := range n {
			chunks = append(chunks, chunk{i, j})
		}
	}

	workers := runtime.GOMAXPROCS(0)
	err := parallel.Each(ctx, chunks, workers, func() []byte { return make([]byte, HashChunkSize) },
		func(_ context.Context, c chunk, buf []byte) error {
			d, err := sumChunk(files[c.file], int64(c.index)*HashChunkSize, buf)
			if err != nil {
				return fmt.Errorf("checksum %s: %w", paths[c.file], err)
			}
			digests[c.file][c.index] = d
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
		out[i] = File{Path: p, Size: sizes[i], XXH64: PiecesChecksum(digests[i])}
	}
	return out, nil
}

// sumChunk hashes the chunk of f at off; the last chunk of a file may be short.
func sumChunk(f *os.File, off int64, buf []byte) (uint64, error) {
	n, err := f.ReadAt(buf, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return 0, err
	}
	return xxhash.Sum64(buf[:n]), nil
}

// Summer computes the checksum of a file from its bytes in order, the same checksum
// Commit computes from the file itself: for files that pass through gpucr on their way to
// a store and are never written locally.
type Summer struct {
	h       *xxhash.Digest
	n       int64 // bytes in the current chunk
	size    int64
	digests []uint64
}

// NewSummer starts the checksum of an empty file.
func NewSummer() *Summer { return &Summer{h: xxhash.New()} }

// Write adds the next bytes of the file; it never fails.
func (s *Summer) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := min(int64(len(p)), HashChunkSize-s.n)
		s.h.Write(p[:k])
		s.n += k
		s.size += k
		p = p[k:]
		if s.n == HashChunkSize {
			s.digests = append(s.digests, s.h.Sum64())
			s.h.Reset()
			s.n = 0
		}
	}
	return n, nil
}

// File is the manifest entry of the file at path with the bytes written so far.
func (s *Summer) File(path string) File {
	digests := s.digests
	if s.n > 0 {
		digests = append(slices.Clip(digests), s.h.Sum64())
	}
	return File{Path: path, Size: s.size, XXH64: PiecesChecksum(digests)}
}

// PiecesChecksum is the checksum of a file, as a manifest writes it, from the xxh64
// digests of its HashChunkSize pieces in order, however they were computed.
func PiecesChecksum(digests []uint64) string { return fmt.Sprintf("%016x", combine(digests)) }

// combine folds a file's chunk digests into its checksum.
func combine(digests []uint64) uint64 {
	h := xxhash.New()
	var b [8]byte
	for _, d := range digests {
		binary.LittleEndian.PutUint64(b[:], d)
		h.Write(b[:])
	}
	return h.Sum64()
}
