package chunked

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/parallel"
	"github.com/gpucr/gpucr/internal/signing"
	"github.com/gpucr/gpucr/internal/store"
)

// Options tune a push or pull.
type Options struct {
	// Progress, when set, hears how many of the image's bytes are done out of the total.
	// Calls are serialized.
	Progress func(done, total int64)
	// Workers is how many chunks are in flight at once; 0 means workers().
	Workers int
	// Trust, when not empty, makes a pull refuse an image not signed by one of its keys
	// before the image appears at its destination.
	Trust signing.Keys
	// Signed makes a Stream take each file's SHA-256 as well as its xxh64: the image it
	// stores is to be signed, and its manifest must cover every byte (image.File.SHA256).
	Signed bool
	// Waiting, when set, hears once what a push or stream waits for before it begins (a
	// collection in its store directory to stop), so that a user knows why nothing moves.
	Waiting func(what string)
	// Staging, when set, is the journaled directory a pull assembles the image in (beside
	// its destination; made by the pull): a killed pull leaves it to recovery.
	Staging string
}

// Stats count what a push or pull moved.
type Stats struct {
	Files int
	Bytes int64 // bytes of the image
	// ZeroBytes are in zero chunks: recorded, neither stored nor transferred.
	ZeroBytes int64
	// Chunks counts the non-zero chunks. Of the distinct ones (a chunk repeated within the
	// image counts once), Transferred were uploaded (push) or downloaded (pull), Present
	// were already in the store (push). Replaced were in a store others can write under
	// their name with other bytes (planted, or damaged), and uploaded again.
	Chunks, Transferred, Present, Replaced int
	// TransferredBytes is the uncompressed size of the transferred chunks, WireBytes what
	// they took compressed, PresentBytes the uncompressed size of those already present.
	TransferredBytes, WireBytes, PresentBytes int64
}

// workers is the default concurrency: every core compresses or decompresses, and at least
// four requests are in flight so that a store's latency is overlapped.
func workers() int { return max(4, runtime.GOMAXPROCS(0)) }

func (o Options) workers() int {
	if o.Workers > 0 {
		return o.Workers
	}
	return workers()
}

// zeroChunk is compared against to find chunks that are all zero.
var zeroChunk = make([]byte, ChunkSize)

// Push verifies the image in dir and stores it at prefix in st: each file is read in
// ChunkSize pieces, zero pieces are recorded, the others are hashed, skipped if the store
// has them and otherwise compressed and uploaded, all in parallel; the manifest object is
// created last. Nothing is copied locally: memory holds at most two chunk buffers per
// worker. On error nothing lists as a checkpoint at prefix, and pushing again reuses the
// chunks already uploaded.
func Push(ctx context.Context, st store.Store, prefix, dir string, o Options) (*Manifest, *Stats, error) {
	if err := CheckFree(ctx, st, prefix); err != nil {
		return nil, nil, err
	}
	im, held, err := holdVerified(dir)
	if err != nil {
		return nil, nil, err
	}
	defer held.close()
	up, err := newUploader(ctx, st, prefix, o)
	if err != nil {
		return nil, nil, err
	}
	defer up.close()
	p, err := newPusher(up, dir, held, o)
	if err != nil {
		return nil, nil, err
	}
	if err := p.run(ctx); err != nil {
		return nil, nil, err
	}
	if err := held.unchanged(dir, verifiedIn(im)); err != nil {
		return nil, nil, err
	}
	m, err := up.storeManifest(ctx, im, p.files)
	if err != nil {
		return nil, nil, err
	}
	return m, &up.stats, nil
}

// holdVerified holds the files of the image in dir open and verifies them: the image's
// manifest is read again once they are held, the files are checked against it, and each
// is then still the held file, unchanged. Logs are held, not verified: no manifest lists
// them.
func holdVerified(dir string) (*image.Manifest, *heldFiles, error) {
	first, _, err := image.LoadTrusted(dir, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("push %s: %w", dir, err)
	}
	paths, err := pushPaths(dir, first)
	if err != nil {
		return nil, nil, err
	}
	held, err := holdFiles(dir, paths)
	if err != nil {
		// A file missing or not regular: the image's own check says what is wrong with it.
		if _, verr := image.Open(dir); verr != nil {
			return nil, nil, fmt.Errorf("push %s: %w", dir, verr)
		}
		return nil, nil, err
	}
	im, err := image.Open(dir)
	if err == nil && !reflect.DeepEqual(im, first) {
		err = &changedError{image.ManifestName}
	}
	if err != nil {
		held.close()
		return nil, nil, fmt.Errorf("push %s: %w", dir, err)
	}
	if err := held.unchanged(dir, verifiedIn(im)); err != nil {
		held.close()
		return nil, nil, err // names the push already
	}
	return im, held, nil
}

// verifiedIn says which of an image's files verification reads: its manifest, seal and
// signature, and the files its manifest m lists.
func verifiedIn(m *image.Manifest) func(path string) bool {
	listed := map[string]bool{image.ManifestName: true, image.SealName: true, image.SigName: true}
	for _, f := range m.Files {
		listed[f.Path] = true
	}
	return func(path string) bool { return listed[path] }
}

// manifestObject is the manifest object of the image im stored as files, and its bytes.
func manifestObject(im *image.Manifest, files []File) (*Manifest, []byte, error) {
	m := &Manifest{Format: FormatVersion, ChunkSize: ChunkSize, Compression: compression,
		Pushed: time.Now().UTC(), Image: *im, Files: files}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, nil, fmt.Errorf("encode manifest: %w", err)
	}
	return m, b, nil
}

// createManifest writes the manifest object b, which makes the checkpoint exist. Create,
// not Put: of two pushes racing to one prefix, one wins and the other fails.
func createManifest(ctx context.Context, st store.Store, prefix string, b []byte) error {
	if err := st.Create(ctx, ManifestKey(prefix), b); err != nil {
		if errors.Is(err, store.ErrExists) {
			if ours(ctx, st, ManifestKey(prefix), b) {
				return nil
			}
			return fmt.Errorf("%s: %w", st.URL(prefix), ErrExists)
		}
		return fmt.Errorf("write manifest: %w", err)
	}
	return nil
}

// ours says whether the object at key holds exactly b: a client that sends a write again
// after losing the answer to the first (minio-go retries) finds the object its first one
// made, and its conditional create fails (review). A manifest names the time it was
// written to the nanosecond: another push's is never the same bytes.
func ours(ctx context.Context, st store.Store, key string, b []byte) bool {
	r, err := st.Get(ctx, key)
	if err != nil {
		return false
	}
	defer r.Close()
	got, err := io.ReadAll(io.LimitReader(r, int64(len(b))+1))
	return err == nil && bytes.Equal(got, b)
}

// CheckFree fails unless a checkpoint could be stored at prefix in st now: a name a
// checkpoint can have, and none there yet. A checkpoint written locally and stored after
// asks before it begins, not once the workload is checkpointed.
func CheckFree(ctx context.Context, st store.Store, prefix string) error {
	if err := checkPrefix(prefix); err != nil {
		return err
	}
	if err := checkPlace(ctx, st, prefix); err != nil {
		return err
	}
	return absent(ctx, st, prefix)
}

// absent checks that no checkpoint is at prefix yet, so that a push fails before it reads
// the image rather than after it uploaded it.
func absent(ctx context.Context, st store.Store, prefix string) error {
	_, err := st.Stat(ctx, ManifestKey(prefix))
	switch {
	case err == nil:
		return fmt.Errorf("%s: %w", st.URL(prefix), ErrExists)
	case errors.Is(err, store.ErrNotFound):
		return nil
	}
	return err
}

// pushPaths lists what a push stores, in the order a restore needs it (restoreOrder): the
// manifest and its seal, every file it lists and CRIU's logs, which are not checksummed by
// the image but are what one reads when a restore fails. A push uploads in this order.
func pushPaths(dir string, m *image.Manifest) ([]string, error) {
	paths := []string{image.ManifestName, image.SealName}
	switch _, err := os.Lstat(filepath.Join(dir, image.SigName)); {
	case err == nil:
		paths = append(paths, image.SigName)
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("read signatures of %s: %w", dir, err)
	}
	for _, f := range m.Files {
		paths = append(paths, f.Path)
	}
	logs, err := os.ReadDir(filepath.Join(dir, image.LogsDir))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("list logs of %s: %w", dir, err)
	}
	n := 0
	for _, e := range logs {
		if e.Type().IsRegular() {
			paths = append(paths, image.LogsDir+"/"+e.Name())
			n++
		}
	}
	// Stored, such an image would be refused by every pull (Manifest.problem): refused here,
	// before anything is sent.
	switch {
	case n > maxLogFiles:
		return nil, fmt.Errorf("push %s: %d files in %s, more than the %d of CRIU's logs a stored checkpoint may hold", dir, n, image.LogsDir, maxLogFiles)
	case len(paths) > maxFiles:
		return nil, fmt.Errorf("push %s: %d files, more than the %d a stored checkpoint may hold", dir, len(paths), maxFiles)
	}
	slices.SortFunc(paths, restoreOrder(m))
	return slices.Compact(paths), nil
}

// uploader stores chunks under one checkpoint's prefix, each distinct chunk once, and
// counts what it moved. Push and Stream share it.
type uploader struct {
	st     store.Store
	prefix string
	enc    *zstd.Encoder
	lease  *lease // held while chunks may be reused: no collection sweeps meanwhile

	// dec reads back the chunks a push would reuse, where others can write the store: nil
	// where they cannot, and a stored chunk is taken on its name.
	dec *zstd.Decoder

	mu    sync.Mutex
	stats Stats
	// seen holds the chunks this push has met, by key, so that a chunk that repeats
	// within the image is looked up and uploaded once.
	seen map[string]*seenChunk
}

func newUploader(ctx context.Context, st store.Store, prefix string, o Options) (*uploader, error) {
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(o.workers()), zstd.WithEncoderLevel(zstd.SpeedDefault))
	if err != nil {
		return nil, fmt.Errorf("zstd: %w", err)
	}
	u := &uploader{st: st, prefix: prefix, enc: enc, seen: map[string]*seenChunk{}}
	if sh, ok := st.(store.Shared); ok && sh.OthersCanWrite(chunksKey(ParentDir(prefix))) {
		if u.dec, err = newDecoder(o.workers()); err != nil {
			enc.Close()
			return nil, err
		}
	}
	if u.lease, err = writeLease(ctx, st, ParentDir(prefix), o.Waiting); err != nil {
		u.close()
		return nil, err
	}
	return u, nil
}

// storeManifest writes the manifest of the image im stored as files once every chunk it
// names is surely stored, and keeps it only if they surely still are once it is written. A
// push whose lease went stale, before or while its manifest was written (a hung store, a
// stopped gpucr), was taken for dead by a collection, which may have removed chunks it had
// stored or reused (hostile test, review): the chunks are checked, and a push missing one
// fails, its manifest removed, and pushing again repairs it.
func (u *uploader) storeManifest(ctx context.Context, im *image.Manifest, files []File) (*Manifest, error) {
	m, b, err := manifestObject(im, files)
	if err != nil {
		return nil, err
	}
	mark := 0
	if live, _ := u.lease.liveSince(0); !live {
		if mark, err = u.confirmChunks(ctx, files); err != nil {
			return nil, err
		}
	}
	cerr := createManifest(ctx, u.st, u.prefix, b)
	if live, _ := u.lease.liveSince(mark); live {
		if cerr != nil {
			return nil, cerr
		}
		return m, nil
	}
	// The lease lapsed while the manifest was written: whatever the write answered (an
	// answer can be lost), the manifest may be there, naming chunks a collection removed.
	key := ManifestKey(u.prefix)
	if cerr != nil && !ours(context.WithoutCancel(ctx), u.st, key, b) { // an interrupt may be why it failed
		return nil, cerr
	}
	_, err = u.confirmChunks(ctx, files)
	switch {
	case err == nil:
		return m, nil
	case errors.Is(err, store.ErrNotFound):
		if derr := u.st.Delete(context.WithoutCancel(ctx), key); derr != nil {
			return nil, fmt.Errorf("%w; and its manifest, written meanwhile, could not be removed: %v (gpucr rm %s)", err, derr, u.st.URL(u.prefix))
		}
		return nil, err
	}
	// Not known to be missing any: the checkpoint stays, unconfirmed, and the push says so.
	return nil, fmt.Errorf("the checkpoint at %s is stored, but its chunks could not be checked after its lease lapsed (%w): "+
		"pull it to see that it is whole, or remove it (gpucr rm) and push again", u.st.URL(u.prefix), err)
}

// confirmChunks waits for any collection to stop, then checks that every chunk files name
// is stored, and returns the lease's mark from which no collection ran.
func (u *uploader) confirmChunks(ctx context.Context, files []File) (int, error) {
	if err := u.lease.awaitNoCollection(ctx, nil); err != nil {
		return 0, err
	}
	mark := u.lease.mark() // live again from here: no collection starts while it stays so
	var keys []string
	seen := map[string]bool{}
	for _, f := range files {
		for _, c := range f.Chunks {
			if !c.Zero && !seen[c.SHA256] {
				seen[c.SHA256] = true
				keys = append(keys, ChunkKey(u.prefix, c.SHA256))
			}
		}
	}
	err := parallel.Each(ctx, keys, workers(), func() struct{} { return struct{}{} }, func(ctx context.Context, key string, _ struct{}) error {
		_, err := u.st.Stat(ctx, key)
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("this push's lease went stale for a while, and a collection removed chunk %s meanwhile: push again (%w)", u.st.URL(key), err)
		}
		return err
	})
	if err != nil {
		return 0, err
	}
	if live, _ := u.lease.liveSince(mark); !live {
		return 0, fmt.Errorf("this push's lease in %s went stale again while its chunks were checked: push again", u.st.URL(leasesKey(ParentDir(u.prefix))))
	}
	return mark, nil
}

// close ends the upload, once the manifest object is written or the push given up; also
// one whose lease could not be written.
func (u *uploader) close() {
	u.enc.Close()
	if u.dec != nil {
		u.dec.Close()
	}
	if u.lease != nil {
		u.lease.release()
	}
}

// pusher is one push of a local image in progress.
type pusher struct {
	*uploader
	o      Options
	paths  []string
	opened []*os.File // held by the caller
	files  []File
	ends   [][]int64 // where each file's chunks end
	total  int64
	done   int64
}

// job is one chunk to read: file index, chunk index, offset and length.
type job struct {
	file, index int
	off, size   int64
}

func newPusher(up *uploader, dir string, held *heldFiles, o Options) (*pusher, error) {
	p := &pusher{uploader: up, o: o, paths: held.paths, opened: held.files}
	for i, rel := range held.paths {
		p.files = append(p.files, File{Path: rel, Size: held.ids[i].size})
		p.total += held.ids[i].size
	}
	cuts := pageCuts(held, p.files)
	for i, f := range p.files {
		ends, ok := cuts[f.Path]
		if !ok {
			ends = fixedCuts(f.Size)
		}
		p.ends = append(p.ends, ends)
		p.files[i].Chunks = make([]Chunk, len(ends))
	}
	p.count(func(s *Stats) { s.Files += len(p.paths); s.Bytes += p.total })
	return p, nil
}

// fixedCuts ends chunks every ChunkSize bytes, and at the end of the file.
func fixedCuts(size int64) []int64 {
	var ends []int64
	for off := int64(ChunkSize); off < size; off += ChunkSize {
		ends = append(ends, off)
	}
	if size > 0 {
		ends = append(ends, size)
	}
	return ends
}

func (p *pusher) jobs() []job {
	var js []job
	for i, ends := range p.ends {
		var off int64
		for j, end := range ends {
			js = append(js, job{i, j, off, end - off})
			off = end
		}
	}
	return js
}

func (p *pusher) run(ctx context.Context) error {
	return runJobs(ctx, p.jobs(), p.o.workers(), func(ctx context.Context, j job, buf *buffers) error {
		c, err := p.chunk(ctx, j, buf)
		if err != nil {
			return err
		}
		p.files[j.file].Chunks[j.index] = c
		p.progress(j.size)
		return nil
	})
}

// chunk reads one chunk of a file and stores it; one in a hole is zeros, not read.
func (p *pusher) chunk(ctx context.Context, j job, buf *buffers) (Chunk, error) {
	if image.InHole(p.opened[j.file], j.off, j.size) {
		p.count(func(s *Stats) { s.ZeroBytes += j.size })
		return Chunk{Size: j.size, Zero: true}, nil
	}
	data := buf.raw[:j.size]
	// A full read returns no error, io.EOF included: any error means the file changed.
	if _, err := p.opened[j.file].ReadAt(data, j.off); err != nil {
		return Chunk{}, fmt.Errorf("read %s at %d: %w", p.paths[j.file], j.off, err)
	}
	return p.put(ctx, data, nil, buf, p.paths[j.file], j.off)
}

// put records data as a zero chunk, or hashes it (unless known holds its xxh64 and
// SHA-256, taken as it arrived) and, unless the store has it already, compresses and uploads
// it. file and off name the chunk in errors.
func (u *uploader) put(ctx context.Context, data []byte, known *image.Piece, buf *buffers, file string, off int64) (Chunk, error) {
	size := int64(len(data))
	if bytes.Equal(data, zeroChunk[:size]) {
		u.count(func(s *Stats) { s.ZeroBytes += size })
		return Chunk{Size: size, Zero: true}, nil
	}
	if known == nil {
		d := image.SumPiece(data, true)
		known = &d
	}
	c := Chunk{Size: size, SHA256: hex.EncodeToString(known.SHA256[:]), XXH64: fmt.Sprintf("%016x", known.XXH64)}
	stored, err := u.store(ctx, c, data, buf, file, off)
	if err != nil {
		return Chunk{}, err
	}
	u.count(func(s *Stats) { s.Chunks++ })
	c.Stored = stored
	return c, nil
}

// store makes sure the chunk at key is in the store and returns its stored size. The
// first worker to meet a chunk looks it up and uploads it if needed; one that meets the
// same chunk meanwhile (a repeat within the image) waits for that and reuses its result.
func (u *uploader) store(ctx context.Context, c Chunk, data []byte, buf *buffers, file string, off int64) (int64, error) {
	key := ChunkKey(u.prefix, c.SHA256)
	u.mu.Lock()
	e, found := u.seen[key]
	if !found {
		e = &seenChunk{done: make(chan struct{})}
		u.seen[key] = e
	}
	u.mu.Unlock()
	if found {
		select {
		case <-e.done:
			return e.stored, e.err
		case <-ctx.Done():
			return 0, context.Cause(ctx)
		}
	}
	defer close(e.done)
	size := int64(len(data))
	e.stored, e.err = u.st.Stat(ctx, key)
	if e.err == nil && u.dec != nil && !u.intact(ctx, c, buf, file, off) {
		u.count(func(s *Stats) { s.Replaced++ })
		e.err = store.ErrNotFound // stored again, over what is there
	}
	switch {
	case e.err == nil:
		u.count(func(s *Stats) { s.Present++; s.PresentBytes += size })
	case errors.Is(e.err, store.ErrNotFound):
		var sum uint32
		buf.comp, sum = compress(u.enc, data, buf.comp[:0])
		e.stored, e.err = int64(len(buf.comp)), u.putChunk(ctx, key, buf.comp, sum)
		if e.err != nil {
			e.err = fmt.Errorf("upload %s at %d: %w", file, off, e.err)
		} else {
			u.count(func(s *Stats) { s.Transferred++; s.TransferredBytes += size; s.WireBytes += e.stored })
		}
	}
	return e.stored, e.err
}

// putChunk stores a chunk's frame, whose CRC32C is sum.
func (u *uploader) putChunk(ctx context.Context, key string, frame []byte, sum uint32) error {
	if c, ok := u.st.(store.Checksummed); ok {
		return c.PutChecked(ctx, key, frame, sum)
	}
	return u.st.Put(ctx, key, frame)
}

// intact says whether the object stored under chunk c's name holds c's bytes, checked by
// their SHA-256, the name itself: whoever put it there could match any weaker digest.
func (u *uploader) intact(ctx context.Context, c Chunk, buf *buffers, file string, off int64) bool {
	if buf.check == nil {
		buf.check = make([]byte, 0, ChunkSize)
	}
	_, comp, err := fetchChunk(ctx, u.st, u.prefix, u.dec, file, off, Chunk{Size: c.Size, SHA256: c.SHA256}, buf.check, buf.comp[:0], nil)
	buf.comp = comp
	return err == nil
}

// seenChunk is a chunk this push has met: done closes when stored or err is known.
type seenChunk struct {
	done   chan struct{}
	stored int64
	err    error
}

func (u *uploader) count(f func(*Stats)) {
	u.mu.Lock()
	defer u.mu.Unlock()
	f(&u.stats)
}

func (p *pusher) progress(n int64) {
	if p.o.Progress == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done += n
	p.o.Progress(p.done, p.total)
}
