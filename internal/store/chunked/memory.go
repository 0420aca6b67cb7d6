package chunked

import (
	"context"
	"fmt"
	"path"
	"sort"
	"strconv"
	"sync"

	"github.com/klauspost/compress/zstd"

	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/store"
)

// Memory serves the memory gpucr saved (criuimg.MemDir) of a stored checkpoint to a
// restore's fill (a memfill.Source): each chunk is fetched when the fill reads it and
// checked (checkChunk) before its bytes are used, and each piece is hashed as the image hashes
// it, so that Verify holds the restored tasks until every file is the one the image's own
// verified manifest lists. Nothing of it is written to local disk.
type Memory struct {
	st     store.Store
	prefix string
	dec    *zstd.Decoder
	files  map[string]*memFile
	bufs   sync.Pool // compressed chunks, and chunks read in part

	mu    sync.Mutex
	stats Stats
}

// memFile is one file of the saved memory: its chunks, where each ends, and the digests
// of its image pieces as the fill read them.
type memFile struct {
	*image.FileReads
	chunks []Chunk
	ends   []int64
}

// newMemory serves the files im (the image's verified manifest) lists under
// criuimg.MemDir, from the chunks m lists for them.
func newMemory(st store.Store, prefix string, m *Manifest, im *image.Manifest, o Options) (*Memory, error) {
	stored := map[string]File{}
	for _, f := range m.Files {
		stored[f.Path] = f
	}
	mem := &Memory{st: st, prefix: prefix, files: map[string]*memFile{}}
	mem.bufs.New = func() any { b := make([]byte, 0, maxStored+1); return &b }
	for _, f := range im.Files {
		if path.Dir(f.Path) != criuimg.MemDir {
			continue
		}
		s, ok := stored[f.Path]
		if !ok || s.Size != f.Size {
			return nil, fmt.Errorf("%s: %w: %s is not stored as the image lists it", st.URL(prefix), ErrBadManifest, f.Path)
		}
		mf := &memFile{FileReads: image.NewFileReads(f), chunks: s.Chunks}
		var end int64
		for _, c := range s.Chunks {
			end += c.Size
			mf.ends = append(mf.ends, end)
		}
		mem.files[f.Path] = mf
		mem.stats.Files++
		mem.stats.Bytes += f.Size
	}
	dec, err := newDecoder(max(o.workers(), 8))
	if err != nil {
		return nil, err
	}
	mem.dec = dec
	return mem, nil
}

// ReadPiece hands use the file at name (slash-separated, relative to the image) from off,
// len(p) bytes, fetching the chunks that hold them, each part as soon as it is checked; zero
// chunks are zeros, fetched from nowhere. The parts of a whole chunk stored raw lie where
// they arrived, not in p (see fetchChunk); use must not keep any part.
func (mem *Memory) ReadPiece(ctx context.Context, name string, off int64, p []byte, use func(at int, part []byte) error) error {
	f := mem.files[name]
	end := off + int64(len(p))
	if f == nil || off < 0 || end > f.File.Size {
		return fmt.Errorf("memory fill: %s has no bytes %d-%d in %s", name, off, end, mem.st.URL(mem.prefix))
	}
	// A whole image piece is hashed as the image's checksum hashes it, each chunk's bytes
	// as they are checked; a piece that is one chunk takes that chunk's checked xxh64.
	var piece *image.PieceHash
	var digest image.Piece
	i := sort.Search(len(f.ends), func(i int) bool { return f.ends[i] > off })
	k, isPiece := f.Piece(off, int64(len(p)))
	if isPiece { // a piece has bytes, so chunk i holds its first
		var same bool
		if digest, same = samePiece(f.chunks[i], f.ends[i]-off, len(p), f.File.Strong()); !same {
			piece = image.NewPieceHash(f.File.Strong())
		}
	}
	for at := off; at < end; i++ {
		c, start := f.chunks[i], f.ends[i]-f.chunks[i].Size
		n := min(end, f.ends[i]) - at
		from := int(at - off)
		err := mem.chunk(ctx, name, c, start, at-start, p[from:from+int(n)], piece, func(k int, part []byte) error {
			return use(from+k, part)
		})
		if err != nil {
			return err
		}
		at += n
	}
	if isPiece {
		if piece != nil {
			digest = piece.Sum()
		}
		mem.mu.Lock()
		f.Record(k, digest)
		mem.mu.Unlock()
	}
	return nil
}

// chunk hands use the bytes of chunk c (which starts at start in file name) from its offset
// within, len(dst) of them, and writes them to piece (when not nil). A chunk read whole is
// handed over as fetchChunk returns it; one read in part is copied into dst first.
func (mem *Memory) chunk(ctx context.Context, name string, c Chunk, start, within int64, dst []byte, piece *image.PieceHash, use func(k int, part []byte) error) error {
	if c.Zero {
		clear(dst)
		if piece != nil {
			piece.Add(dst)
		}
		mem.count(func(s *Stats) { s.ZeroBytes += int64(len(dst)) })
		return use(0, dst)
	}
	comp := mem.bufs.Get().(*[]byte)
	defer mem.bufs.Put(comp)
	whole := within == 0 && int64(len(dst)) == c.Size
	decoded, also := dst[:0:len(dst)], piece // a whole chunk is hashed for the piece as it is checked
	if !whole {
		part := mem.bufs.Get().(*[]byte)
		defer mem.bufs.Put(part)
		decoded, also = (*part)[:0], nil
	}
	parts, b, err := fetchChunk(ctx, mem.st, mem.prefix, mem.dec, name, start, c, decoded, *comp, also)
	*comp = b[:0]
	if err != nil {
		return err
	}
	mem.count(func(s *Stats) {
		s.Chunks++
		s.Transferred++
		s.TransferredBytes += c.Size
		s.WireBytes += int64(len(b))
	})
	if !whole {
		copyFrom(dst, parts, within)
		if piece != nil {
			piece.Add(dst)
		}
		return use(0, dst)
	}
	k := 0
	for _, part := range parts {
		if err := use(k, part); err != nil {
			return err
		}
		k += len(part)
	}
	return nil
}

// samePiece returns the image digests of a piece of n bytes when chunk c is exactly that
// piece, so that its check against the chunk object's xxh64 gives them: a piece of an
// unsigned image, whose only digest is that xxh64. left is how many of c's bytes lie from
// the piece's start on; c starts where the piece does when that is all of them.
func samePiece(c Chunk, left int64, n int, strong bool) (image.Piece, bool) {
	if strong || c.Zero || c.Size != left || left != int64(n) || !image.IsXXH64(c.XXH64) {
		return image.Piece{}, false
	}
	x, err := strconv.ParseUint(c.XXH64, 16, 64)
	return image.Piece{XXH64: x}, err == nil
}

// copyFrom fills dst with the bytes of parts (in order) from offset skip.
func copyFrom(dst []byte, parts [][]byte, skip int64) {
	for _, part := range parts {
		if skip >= int64(len(part)) {
			skip -= int64(len(part))
			continue
		}
		n := copy(dst, part[skip:])
		dst, skip = dst[n:], 0
		if len(dst) == 0 {
			return
		}
	}
}

// Verify says whether every file was read whole, and is the image's: the digests of its
// pieces make the checksum the image's manifest lists.
func (mem *Memory) Verify() error {
	mem.mu.Lock()
	defer mem.mu.Unlock()
	for name, f := range mem.files {
		if !f.Whole() {
			return &image.CorruptError{Path: name, Reason: "not read whole from the store by the restore"}
		}
		if err := f.Check(); err != nil {
			return fmt.Errorf("%w: %s holds other bytes than the image", err, mem.st.URL(mem.prefix))
		}
	}
	return nil
}

// Stats count what the fill fetched so far.
func (mem *Memory) Stats() Stats {
	mem.mu.Lock()
	defer mem.mu.Unlock()
	return mem.stats
}

func (mem *Memory) count(f func(*Stats)) {
	mem.mu.Lock()
	defer mem.mu.Unlock()
	f(&mem.stats)
}

// Close lets the decoder go.
func (mem *Memory) Close() { mem.dec.Close() }
