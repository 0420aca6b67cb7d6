package chunked

import (
	"context"
	"fmt"
	"path"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/klauspost/compress/zstd"

	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/memfill"
	"github.com/gpucr/gpucr/internal/parallel"
	"github.com/gpucr/gpucr/internal/store"
)

// Memory serves the memory gpucr saved (criuimg.MemDir) of a stored checkpoint to a
// restore's fill (a memfill.Source): each chunk is fetched when the fill reads it and
// checked (checkChunk) before its bytes are used, and each piece is hashed as the image hashes
// it, so that Verify holds the restored tasks until every file is the one the image's own
// verified manifest lists. Nothing of it is written to local disk.
type Memory struct {
	st      store.Store
	prefix  string
	dec     *zstd.Decoder
	files   map[string]*memFile
	bufs    sync.Pool // compressed chunks, and chunks read in part or ahead
	workers int

	mu    sync.Mutex
	stats Stats
	ahead map[memfill.Read]*ahead // fetched or being fetched before the fill read them
	stop  context.CancelFunc      // ends the prefetch
	wg    sync.WaitGroup          // the prefetch
}

// PrefetchBytes bounds what a Memory fetches ahead of its fill (Prefetch): held in memory
// until the fill takes it, it is what the store sends while CRIU restores the processes.
const PrefetchBytes = 2 << 30

// ahead is a chunk that is one whole read of the fill, fetched before the fill asked for it.
// Whoever claims it first fetches it: the prefetch, or the fill itself if it came first.
type ahead struct {
	claimed atomic.Bool
	done    chan struct{} // closed once the prefetch that claimed it is done
	parts   [][]byte      // the chunk's bytes, checked, in bufs
	bufs    []*[]byte     // from Memory.bufs, given back once the fill took the parts
	piece   *image.Piece  // the digests of the image piece the read is, if it is one
	err     error
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
	mem := &Memory{st: st, prefix: prefix, files: map[string]*memFile{}, workers: o.workers(), ahead: map[memfill.Read]*ahead{}, stop: func() {}}
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
	if done, err := mem.readAhead(ctx, f, memfill.Read{Path: name, Off: off, Len: int64(len(p))}, use); done {
		return err
	}
	i := sort.Search(len(f.ends), func(i int) bool { return f.ends[i] > off })
	k, isPiece := f.Piece(off, int64(len(p)))
	if isPiece { // a piece has bytes, so chunk i holds its first
		if d, ok := samePiece(f.chunks[i], f.ends[i]-off, len(p), f.File.Strong()); ok {
			// The chunk is the piece: checking it against its xxh64 takes the piece's digest.
			err := mem.chunk(ctx, name, f.chunks[i], off, 0, p, nil, use)
			if err == nil {
				mem.mu.Lock()
				f.Record(k, d)
				mem.mu.Unlock()
			}
			return err
		}
	}
	// A whole image piece is hashed as the image's checksum hashes it, each chunk's bytes
	// as they are checked.
	var piece *image.PieceHash
	if isPiece {
		piece = image.NewPieceHash(f.File.Strong())
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
	if piece != nil {
		d := piece.Sum()
		mem.mu.Lock()
		f.Record(k, d)
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
	parts, err := mem.fetch(ctx, name, c, start, decoded, comp, also)
	if err != nil {
		return err
	}
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

// fetch is fetchChunk of chunk c of file name, which starts at start there, with comp the
// buffer for its bytes as stored, counted in the stats.
func (mem *Memory) fetch(ctx context.Context, name string, c Chunk, start int64, decoded []byte, comp *[]byte, also *image.PieceHash) ([][]byte, error) {
	parts, b, err := fetchChunk(ctx, mem.st, mem.prefix, mem.dec, name, start, c, decoded, *comp, also)
	*comp = b[:0]
	if err != nil {
		return nil, err
	}
	mem.count(func(s *Stats) {
		s.Chunks++
		s.Transferred++
		s.TransferredBytes += c.Size
		s.WireBytes += int64(len(b))
	})
	return parts, nil
}

// Prefetch fetches, in order, the reads that are each one whole chunk stored, up to
// PrefetchBytes of them, on the Memory's workers, until the fill takes them (ReadPiece)
// or the Memory is closed. Each is checked as a fill's own fetch is.
func (mem *Memory) Prefetch(ctx context.Context, reads []memfill.Read) {
	type job struct {
		r memfill.Read
		a *ahead
	}
	var jobs []job
	budget := int64(PrefetchBytes)
	mem.mu.Lock()
	for _, r := range reads {
		f := mem.files[r.Path]
		if f == nil || budget < r.Len || mem.ahead[r] != nil {
			continue
		}
		if _, ok := f.wholeChunk(r.Off, r.Len); !ok {
			continue
		}
		budget -= r.Len
		a := &ahead{done: make(chan struct{})}
		mem.ahead[r] = a
		jobs = append(jobs, job{r, a})
	}
	ctx, cancel := context.WithCancel(ctx)
	before := mem.stop
	mem.stop = func() { before(); cancel() }
	mem.mu.Unlock()
	mem.wg.Add(1)
	go func() {
		defer mem.wg.Done()
		_ = parallel.Each(ctx, jobs, mem.workers, func() struct{} { return struct{}{} }, func(ctx context.Context, j job, _ struct{}) error {
			if j.a.claimed.CompareAndSwap(false, true) {
				mem.fetchAhead(ctx, j.r, j.a)
				close(j.a.done)
			}
			return nil
		})
	}()
}

// fetchAhead fetches into a the chunk that is read r, with the digests of the image piece
// it is, if it is one.
func (mem *Memory) fetchAhead(ctx context.Context, r memfill.Read, a *ahead) {
	f := mem.files[r.Path]
	i, _ := f.wholeChunk(r.Off, r.Len)
	c := f.chunks[i]
	comp := mem.bufs.Get().(*[]byte)
	a.bufs = []*[]byte{comp}
	_, isPiece := f.Piece(r.Off, r.Len)
	d, same := samePiece(c, c.Size, int(r.Len), f.File.Strong())
	var also *image.PieceHash
	if isPiece && !same {
		also = image.NewPieceHash(f.File.Strong())
	}
	// A chunk stored raw is used where it arrived, in comp; one compressed is decoded into
	// a buffer of its own (rare: GPU memory seldom compresses).
	if a.parts, a.err = mem.fetch(ctx, r.Path, c, r.Off, nil, comp, also); a.err != nil || !isPiece {
		return
	}
	if !same {
		d = also.Sum()
	}
	a.piece = &d
}

// readAhead hands use read r of f if it was fetched ahead, recording its piece, and says
// whether it did so (done), with use's error or the fetch's. A read not fetched ahead, or
// whose fetch failed, is left to ReadPiece to fetch itself.
func (mem *Memory) readAhead(ctx context.Context, f *memFile, r memfill.Read, use func(at int, part []byte) error) (done bool, err error) {
	mem.mu.Lock()
	a := mem.ahead[r]
	delete(mem.ahead, r)
	mem.mu.Unlock()
	if a == nil || a.claimed.CompareAndSwap(false, true) {
		return false, nil
	}
	select {
	case <-a.done:
	case <-ctx.Done():
		return true, context.Cause(ctx)
	}
	defer func() {
		for _, b := range a.bufs {
			mem.bufs.Put(b)
		}
	}()
	if a.err != nil {
		return false, nil
	}
	at := 0
	for _, part := range a.parts {
		if err := use(at, part); err != nil {
			return true, err
		}
		at += len(part)
	}
	if a.piece != nil {
		k, _ := f.Piece(r.Off, r.Len)
		mem.mu.Lock()
		f.Record(k, *a.piece)
		mem.mu.Unlock()
	}
	return true, nil
}

// wholeChunk returns the index of the chunk that is exactly the n bytes from off, if one is
// and it is not all zeros (nothing to fetch).
func (f *memFile) wholeChunk(off, n int64) (int, bool) {
	i := sort.Search(len(f.ends), func(i int) bool { return f.ends[i] > off })
	if n <= 0 || i == len(f.ends) || f.chunks[i].Zero || f.ends[i]-f.chunks[i].Size != off || f.chunks[i].Size != n {
		return 0, false
	}
	return i, true
}

// samePiece returns the image digests of a piece of n bytes held whole by chunk c, which
// starts where the piece does and has size bytes there, when its check against the chunk
// object's xxh64 gives them: a piece of an unsigned image whose only digest is that xxh64.
func samePiece(c Chunk, size int64, n int, strong bool) (image.Piece, bool) {
	if strong || c.Zero || c.Size != size || size != int64(n) || !image.IsXXH64(c.XXH64) {
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

// Close ends the prefetch and lets the decoder go.
func (mem *Memory) Close() {
	mem.mu.Lock()
	mem.stop()
	mem.mu.Unlock()
	mem.wg.Wait()
	mem.dec.Close()
}
