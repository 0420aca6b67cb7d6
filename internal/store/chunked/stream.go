package chunked

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"slices"
	"sync"

	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/store"
)

// Stream stores a checkpoint while CRIU writes it: page files arrive through Create and
// are cut, hashed, compressed and uploaded as they come, never written locally; Finish
// then stores the image's other files, small, from a local directory and writes the
// manifest object last. Memory stays at a few chunk buffers per worker: when uploads fall
// behind, Receive waits, and so does CRIU.
type Stream struct {
	up     *uploader
	st     store.Store
	prefix string
	o      Options

	ctx    context.Context
	cancel context.CancelCauseFunc
	work   chan streamJob
	free   chan []byte // chunk buffers not in use
	wg     sync.WaitGroup
	ended  sync.Once // the work channel is closed
	closed sync.Once // the uploader is closed

	mu    sync.Mutex
	files []*StreamFile
}

// streamJob is one full chunk of a streamed file, to store as chunk index of f.
type streamJob struct {
	f     *StreamFile
	index int
	off   int64
	data  []byte
	known *image.Piece // its xxh64 and SHA-256, taken as it arrived; nil: the worker hashes it
}

// NewStream starts a checkpoint at prefix in st. It fails at once if one exists there.
// Cancel ctx, or call Abort, to give it up.
func NewStream(ctx context.Context, st store.Store, prefix string, o Options) (*Stream, error) {
	if err := CheckFree(ctx, st, prefix); err != nil {
		return nil, err
	}
	up, err := newUploader(ctx, st, prefix, o)
	if err != nil {
		return nil, err
	}
	n := o.workers()
	s := &Stream{up: up, st: st, prefix: prefix, o: o, work: make(chan streamJob), free: make(chan []byte, 2*n)}
	s.ctx, s.cancel = context.WithCancelCause(ctx)
	for range 2 * n {
		s.free <- make([]byte, ChunkSize)
	}
	for range n {
		s.wg.Add(1)
		go s.worker()
	}
	return s, nil
}

// worker stores chunks until the work ends (Files) or the stream is given up.
func (s *Stream) worker() {
	defer s.wg.Done()
	buf := &buffers{}
	for {
		var j streamJob
		select {
		case next, ok := <-s.work:
			if !ok {
				return
			}
			j = next
		case <-s.ctx.Done():
			return
		}
		c, err := s.up.put(s.ctx, j.data, j.known, buf, j.f.path, j.off)
		s.free <- j.data[:cap(j.data)]
		if err != nil {
			s.cancel(err)
			continue
		}
		s.mu.Lock()
		j.f.chunks[j.index] = c
		s.mu.Unlock()
	}
}

// Create starts the file at path (slash-separated, relative to the image directory).
func (s *Stream) Create(path string) (*StreamFile, error) {
	if err := context.Cause(s.ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if slices.ContainsFunc(s.files, func(f *StreamFile) bool { return f.path == path }) {
		return nil, fmt.Errorf("stream %s: created twice", path)
	}
	f := &StreamFile{s: s, path: path, sum: image.NewSummer(s.o.Signed), window: -1}
	s.files = append(s.files, f)
	return f, nil
}

// StreamFile is one file of a Stream, received in order.
type StreamFile struct {
	s      *Stream
	path   string
	sum    *image.Summer
	size   int64
	chunks []Chunk // filled in by the workers
	buf    []byte  // the chunk being filled
	window int64   // the ChunkSize window of address space buf holds pages of
	hashes receivedHash
	closed bool
}

// receiveStep is how much Receive reads at a time: little enough that the bytes are still
// in the core's cache when the file's checksums and the chunk's digests are taken of them,
// so that each costs its computation and not another read from memory.
const receiveStep = 256 << 10

// Receive reads the file's next size bytes from r, pages that start at address vaddr.
// Chunks are cut where the address crosses a ChunkSize boundary, as push cuts CRIU's
// page files, so that a streamed checkpoint and a pushed one share their chunks.
func (f *StreamFile) Receive(vaddr uint64, size int, r io.Reader) error {
	addr, left := int64(vaddr), int64(size)
	for left > 0 {
		w := addr / ChunkSize
		if f.buf != nil && (w != f.window || len(f.buf) == ChunkSize) {
			if err := f.emit(); err != nil {
				return err
			}
		}
		if f.buf == nil {
			select {
			case b := <-f.s.free:
				f.buf, f.window = b[:0], w
			case <-f.s.ctx.Done():
				return context.Cause(f.s.ctx)
			}
			f.hashes.start(f.size%image.HashChunkSize == 0, f.s.o.Signed)
		}
		n := min(left, (w+1)*ChunkSize-addr, int64(ChunkSize-len(f.buf)), receiveStep)
		at := len(f.buf)
		f.buf = f.buf[:at+int(n)]
		if _, err := io.ReadFull(r, f.buf[at:]); err != nil {
			// Back to the bytes the digests took: a Close after the failure stores the
			// chunk, under the name of what it holds.
			f.buf = f.buf[:at]
			return fmt.Errorf("receive %s: %w", f.path, err)
		}
		f.sum.Write(f.buf[at:])
		f.hashes.add(f.buf[at:])
		addr, left = addr+n, left-n
	}
	return nil
}

// emit hands the filled chunk to the workers.
func (f *StreamFile) emit() error {
	f.s.mu.Lock()
	index := len(f.chunks)
	f.chunks = append(f.chunks, Chunk{})
	f.s.mu.Unlock()
	j := streamJob{f: f, index: index, off: f.size, data: f.buf, known: f.digests()}
	f.size += int64(len(f.buf))
	f.buf = nil
	select {
	case f.s.work <- j:
		return nil
	case <-f.s.ctx.Done():
		f.s.free <- j.data[:cap(j.data)]
		return context.Cause(f.s.ctx)
	}
}

// digests are the filled chunk's digests as they were taken while it arrived: those of the
// file's piece it is, or its own. nil for a chunk that began a piece and ended short of it
// (a file's last, or one cut by the address window), which the worker hashes itself.
func (f *StreamFile) digests() *image.Piece {
	if f.size%image.HashChunkSize == 0 && len(f.buf) == image.HashChunkSize {
		d, strong, ok := f.sum.Piece(f.size / image.HashChunkSize)
		if !ok {
			return nil
		}
		if !strong {
			d.SHA256 = f.hashes.strong()
		}
		return &d
	}
	if f.hashes.own == nil {
		return nil
	}
	d := f.hashes.own.Sum()
	return &d
}

// receivedHash takes the digests of the chunk being received that the file's Summer does not:
// both for a chunk that is not one of the file's pieces, the SHA-256 alone for one that
// begins a piece of an unsigned image's file, none for one that begins a piece of a signed
// one's (the Summer takes both).
type receivedHash struct {
	own  *image.PieceHash // the chunk's xxh64 and SHA-256; nil while the chunk begins a piece
	sha  hash.Hash        // the SHA-256 of a chunk beginning an unsigned image's piece; else nil
	owns *image.PieceHash // kept for the next chunk that needs its own digests
	shas hash.Hash        // kept likewise
}

// start begins the digests of a chunk: one beginning a piece of its file (piece), of an
// image to be signed (signed) or not.
func (h *receivedHash) start(piece, signed bool) {
	h.own, h.sha = nil, nil
	switch {
	case !piece:
		if h.owns == nil {
			h.owns = image.NewPieceHash(true)
		}
		h.own = h.owns
		h.own.Reset()
	case !signed:
		if h.shas == nil {
			h.shas = sha256.New()
		}
		h.sha = h.shas
		h.sha.Reset()
	}
}

// add takes the chunk's next bytes.
func (h *receivedHash) add(p []byte) {
	if h.own != nil {
		h.own.Add(p)
	}
	if h.sha != nil {
		_, _ = h.sha.Write(p) // hashes never fail
	}
}

// strong is the SHA-256 of a chunk that began an unsigned image's piece.
func (h *receivedHash) strong() (sum [sha256.Size]byte) {
	h.sha.Sum(sum[:0])
	return sum
}

// Close hands over the last chunk; the file is complete once Finish returns.
func (f *StreamFile) Close() error {
	if f.closed {
		return nil
	}
	f.closed = true
	if f.buf == nil {
		return nil
	}
	if len(f.buf) == 0 {
		f.s.free <- f.buf[:cap(f.buf)]
		f.buf = nil
		return nil
	}
	return f.emit()
}

// Files waits until every chunk received is stored and returns the streamed files'
// manifest entries, for the image manifest. Every file must be closed, and nothing
// received, after it.
func (s *Stream) Files() ([]image.File, error) {
	s.mu.Lock()
	files := slices.Clone(s.files)
	s.mu.Unlock()
	for _, f := range files {
		if !f.closed {
			return nil, fmt.Errorf("stream %s: not closed", f.path)
		}
	}
	s.ended.Do(func() { close(s.work) })
	s.wg.Wait()
	if err := context.Cause(s.ctx); err != nil {
		return nil, err
	}
	out := make([]image.File, len(files))
	for i, f := range files {
		out[i] = f.sum.File(f.path)
	}
	return out, nil
}

// Finish stores the image's remaining files from dir — gpucr's manifest, sealed with the
// streamed files in it, CRIU's other files and its logs — and writes the manifest object,
// which makes the checkpoint exist. Call Files first.
func (s *Stream) Finish(ctx context.Context, dir string, im *image.Manifest) (*Manifest, *Stats, error) {
	defer s.Abort()
	streamed := map[string]*StreamFile{}
	for _, f := range s.files {
		streamed[f.path] = f
	}
	all, err := pushPaths(dir, im)
	if err != nil {
		return nil, nil, err
	}
	local := slices.DeleteFunc(all, func(p string) bool { return streamed[p] != nil })
	held, err := holdFiles(dir, local)
	if err != nil {
		return nil, nil, err
	}
	defer held.close()
	p, err := newPusher(s.up, dir, held, s.o)
	if err != nil {
		return nil, nil, err
	}
	if err := p.run(ctx); err != nil {
		return nil, nil, err
	}
	files := p.files
	for _, f := range s.files {
		files = append(files, File{Path: f.path, Size: f.size, Chunks: f.chunks})
	}
	order := restoreOrder(im)
	slices.SortFunc(files, func(a, b File) int { return order(a.Path, b.Path) })
	m, err := s.up.storeManifest(ctx, im, files)
	if err != nil {
		return nil, nil, err
	}
	s.up.count(func(st *Stats) { st.Files += len(s.files); st.Bytes += streamedBytes(s.files) })
	return m, &s.up.stats, nil
}

func streamedBytes(files []*StreamFile) int64 {
	var n int64
	for _, f := range files {
		n += f.size
	}
	return n
}

// URL is where the checkpoint is stored, as `gpucr ls` and `restore --from` name it.
func (s *Stream) URL() string { return s.st.URL(s.prefix) }

// Err is the error that stopped the stream, such as a failed upload; nil if none did or
// the stream was only given up (Abort, or Finish done).
func (s *Stream) Err() error {
	if err := context.Cause(s.ctx); !errors.Is(err, errAborted) {
		return err
	}
	return nil
}

// errAborted is the cause of a stream given up by its owner rather than by a failure.
var errAborted = errors.New("checkpoint stream aborted")

// Stats count what the stream moved; complete once Finish has returned.
func (s *Stream) Stats() Stats {
	s.up.mu.Lock()
	defer s.up.mu.Unlock()
	return s.up.stats
}

// Abort gives the stream up: workers stop, and what was uploaded stays as unreferenced
// chunks, which a later checkpoint of the same job reuses. Safe to call more than once.
func (s *Stream) Abort() {
	s.cancel(errAborted)
	s.wg.Wait()
	s.closed.Do(s.up.close)
}
