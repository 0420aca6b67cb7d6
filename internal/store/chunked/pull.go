package chunked

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/klauspost/compress/zstd"

	"github.com/gpucr/gpucr/internal/beneath"
	"github.com/gpucr/gpucr/internal/diskroom"
	"github.com/gpucr/gpucr/internal/durable"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/parallel"
	"github.com/gpucr/gpucr/internal/signing"
	"github.com/gpucr/gpucr/internal/store"
)

// maxStored bounds how much of a chunk object is read: zstd never grows data by more than
// a few bytes per block, so anything this large is not a chunk this format wrote.
const maxStored = ChunkSize + ChunkSize/8

// ErrNotEmpty means a pull's destination already holds something: pulls never overwrite.
// Its text says what to do, as a bare "is not empty" did not (documentation walk).
var ErrNotEmpty = errors.New("destination is not empty: give a new or empty directory (a pull never writes over what is there)")

// Pull fetches the checkpoint at prefix into dir, which must be absent or empty. Every
// chunk is checked as it arrives (checkChunk) and a bad or missing one is named; zero chunks
// are left as holes. The image is assembled in a hidden directory beside dir, verified with
// image.Open, and only then renamed to dir, so a failed pull leaves nothing at dir.
func Pull(ctx context.Context, st store.Store, prefix, dir string, o Options) (*image.Manifest, *Stats, error) {
	m, err := Load(ctx, st, prefix)
	if err != nil {
		return nil, nil, err
	}
	dir = filepath.Clean(dir)
	if err := checkDest(dir); err != nil {
		return nil, nil, err
	}
	if err := image.CheckParent(dir); err != nil {
		return nil, nil, err
	}
	// The image is built one level down in a ".NAME.partial-*" directory: image.Load refuses
	// that name, yet the image inside it can be opened and verified before the rename.
	staging := o.Staging
	if staging != "" {
		err = os.Mkdir(staging, 0o700)
	} else {
		staging, err = os.MkdirTemp(filepath.Dir(dir), "."+filepath.Base(dir)+".partial-*")
	}
	if err != nil {
		return nil, nil, fmt.Errorf("pull into %s: %w", dir, err)
	}
	defer os.RemoveAll(staging)
	img := filepath.Join(staging, "img")

	kept := *m
	kept.Files = slices.DeleteFunc(slices.Clone(m.Files), func(f File) bool { return !pulled(f.Path, len(o.Trust) > 0) })
	// A manifest object of a few kilobytes can list one small chunk at a million places:
	// what the pull would write must fit before anything is written (a hostile test filled
	// a tmpfs from 1 KiB of chunks).
	if err := diskroom.Check(filepath.Dir(dir), written(kept.Files)); err != nil {
		return nil, nil, fmt.Errorf("pull %s: %w", st.URL(prefix), err)
	}
	p := &puller{st: st, prefix: prefix, m: &kept, o: o, stats: Stats{Files: len(kept.Files)}}
	defer p.close()
	if err := p.create(img); err != nil {
		return nil, nil, err
	}
	if len(o.Trust) > 0 {
		if err := p.signedFirst(ctx, img); err != nil {
			return nil, nil, err
		}
		p.only = func(path string) bool { return !isManifestFile(path) }
	}
	if err := p.run(ctx); err != nil {
		return nil, nil, err
	}
	if err := p.sync(img); err != nil {
		return nil, nil, err
	}
	im, _, err := image.OpenTrusted(img, o.Trust)
	if err != nil {
		return nil, nil, refusal(st.URL(prefix), err)
	}
	// rename(2) replaces an empty directory and fails on a non-empty one, atomically.
	if err := syscall.Rename(img, dir); err != nil {
		if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
			return nil, nil, fmt.Errorf("%s: %w", dir, ErrNotEmpty)
		}
		return nil, nil, fmt.Errorf("pull into %s: rename: %w", dir, err)
	}
	if err := durable.SyncDir(filepath.Dir(dir)); err != nil {
		return nil, nil, fmt.Errorf("image %s pulled but not durable: %w", dir, err)
	}
	return im, &p.stats, nil
}

// signedFirst fetches into img only the manifest, its seal and its signature, checks them
// against p.o.Trust, and refuses a store that lists any other file than the signed manifest
// does, at its size: an untrusted store gets no other byte written (a hostile test's pull
// with --trust wrote until the disk was full, refused only once every byte had arrived).
// Those files are small: one listed larger than its reader reads is refused unfetched (a
// crafted listing had a gigabyte written as manifest.json).
func (p *puller) signedFirst(ctx context.Context, img string) error {
	url := p.st.URL(p.prefix)
	for _, f := range p.m.Files {
		if limit, ok := image.ManifestFileLimit(f.Path); ok && f.Size > limit {
			return fmt.Errorf("%s: %w: %s is listed at %d bytes, more than the %d it may hold", url, ErrBadManifest, f.Path, f.Size, limit)
		}
	}
	p.only = isManifestFile
	if err := p.run(ctx); err != nil {
		return err
	}
	signed, _, err := image.LoadTrusted(img, p.o.Trust)
	if err != nil {
		return refusal(url, err)
	}
	if err := listsSigned(p.m.Files, signed); err != nil {
		return fmt.Errorf("%s: %w: %v", url, ErrBadManifest, err)
	}
	return nil
}

// refusal is the error of a pulled image, from url, that its check refused: untrusted, or
// failed verification.
func refusal(url string, err error) error {
	if errors.Is(err, signing.ErrUntrusted) {
		return fmt.Errorf("%s: %w", url, err)
	}
	return fmt.Errorf("pulled image failed verification: %w", err)
}

// isManifestFile says whether path is the image's manifest, its seal or its signature.
func isManifestFile(path string) bool {
	_, ok := image.ManifestFileLimit(path)
	return ok
}

// listsSigned refuses files, a manifest object's listing, unless each file but the manifest's
// own is one the signed manifest lists, at its size.
func listsSigned(files []File, signed *image.Manifest) error {
	sizes := make(map[string]int64, len(signed.Files))
	for _, f := range signed.Files {
		sizes[f.Path] = f.Size
	}
	for _, f := range files {
		if size, ok := sizes[f.Path]; !isManifestFile(f.Path) && (!ok || size != f.Size) {
			return fmt.Errorf("it lists %s (%d bytes), which the signed manifest does not", f.Path, f.Size)
		}
	}
	return nil
}

// written is how many bytes a pull of files writes: every chunk but the zero ones, which
// stay holes, wherever it is listed.
func written(files []File) int64 {
	var n int64
	for _, f := range files {
		for _, c := range f.Chunks {
			if !c.Zero {
				n += c.Size
			}
		}
	}
	return n
}

// pulled says whether a pull (or a streamed restore) fetches the file at path that a
// manifest object lists. The manifest object is not signed: it may list files the image's
// manifest does not, which the image's own check refuses, but for two kinds that check
// lets by — CRIU's logs, which no restore reads, and what an interrupted gpucr sign left
// (image.CheckListed). An interrupted sign's leftovers are never part of an image; the logs
// are not taken from a store that must prove what it holds (trusted): they are bytes no
// signature covers.
func pulled(p string, trusted bool) bool {
	switch {
	case strings.HasSuffix(p, beneath.ReplaceSuffix) && !strings.Contains(p, "/"):
		return false
	case trusted && path.Dir(p) == image.LogsDir:
		return false
	}
	return true
}

// checkDest accepts a destination that is absent or an empty directory, in an existing
// parent, before anything is downloaded. A missing parent is refused as checkpoint -D
// refuses one (image.ErrParentMissing, exit 2, saying what to do): a pull said only that
// it "does not exist or is not a directory", and exited 1 (documentation walk).
func checkDest(dir string) error {
	if err := image.ParentExists("image directory", dir); err != nil {
		return err
	}
	// A symlink or a mount point cannot take the rename that puts the pulled image in
	// place: refused before anything is fetched (a pull into a mount point fetched and
	// verified everything, then failed with "device or resource busy").
	if err := image.CheckFinal(dir); err != nil && !errors.Is(err, image.ErrNotEmpty) {
		return err
	}
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("pull into %s: %w", dir, err)
	case len(entries) > 0:
		return fmt.Errorf("%s: %w", dir, ErrNotEmpty)
	}
	return nil
}

// puller is one pull in progress.
type puller struct {
	st     store.Store
	prefix string
	m      *Manifest
	o      Options
	dec    *zstd.Decoder
	img    string             // where the files are
	places map[string][]place // by chunk sha256
	total  int64
	only   func(path string) bool // the files run fetches; nil: all

	mu    sync.Mutex
	stats Stats
	done  int64
}

// create makes every file at its final size: what the chunks do not write reads as zeros.
// None is held open: a pull that held each one failed with "too many open files" on a
// manifest listing 200,000 (hostile test).
func (p *puller) create(img string) error {
	p.img = img
	for i, f := range p.m.Files {
		path := p.path(i)
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return fmt.Errorf("pull: %w", err)
		}
		// 0600: the image holds the process's memory, secrets included.
		out, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return fmt.Errorf("pull: %w", err)
		}
		err = out.Truncate(f.Size)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("pull: %w", err)
		}
		p.total += f.Size
	}
	p.stats.Bytes = p.total
	return nil
}

// path is where the i-th file is pulled to.
func (p *puller) path(i int) string {
	return filepath.Join(p.img, filepath.FromSlash(p.m.Files[i].Path))
}

func (p *puller) close() {
	if p.dec != nil {
		p.dec.Close()
	}
}

func (p *puller) run(ctx context.Context) error {
	if p.dec == nil {
		dec, err := newDecoder(p.o.workers())
		if err != nil {
			return err
		}
		p.dec = dec
	}
	// A chunk repeated within the image is fetched once and written to each of its places.
	perFile := make([][]job, len(p.m.Files))
	p.places = map[string][]place{}
	for i, f := range p.m.Files {
		if p.only != nil && !p.only(f.Path) {
			continue
		}
		var off int64
		for j, c := range f.Chunks {
			switch {
			case c.Zero:
				p.stats.ZeroBytes += c.Size
				p.progress(c.Size)
			case p.places[c.SHA256] == nil:
				perFile[i] = append(perFile[i], job{i, j, off, c.Size})
				fallthrough
			default:
				p.places[c.SHA256] = append(p.places[c.SHA256], place{i, off})
			}
			off += c.Size
		}
	}
	// Files side by side, not one after the other: writers of one tmpfs file queue.
	return runJobs(ctx, parallel.Interleave(perFile), p.o.workers(), p.chunk)
}

// place is where in the image a chunk goes: a file index and an offset.
type place struct {
	file int
	off  int64
}

// chunk fetches one chunk, checks it and writes it in place.
func (p *puller) chunk(ctx context.Context, j job, buf *buffers) error {
	f, c := p.m.Files[j.file], p.m.Files[j.file].Chunks[j.index]
	parts, comp, err := fetchChunk(ctx, p.st, p.prefix, p.dec, f.Path, j.off, c, buf.raw, buf.comp, nil)
	buf.comp = comp
	if err != nil {
		return err
	}
	places := p.places[c.SHA256]
	for _, pl := range places {
		if err := p.writeAt(pl, parts); err != nil {
			return err
		}
	}
	p.mu.Lock()
	p.stats.Chunks += len(places)
	p.stats.Transferred++
	p.stats.TransferredBytes += c.Size
	p.stats.WireBytes += int64(len(buf.comp))
	p.mu.Unlock()
	p.progress(c.Size * int64(len(places)))
	return nil
}

// writeAt writes parts one after the other at pl, opening its file for the while.
func (p *puller) writeAt(pl place, parts [][]byte) error {
	f, err := os.OpenFile(p.path(pl.file), os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("pull: %w", err)
	}
	defer f.Close()
	at := pl.off
	for _, part := range parts {
		if _, err := f.WriteAt(part, at); err != nil {
			return fmt.Errorf("write %s at %d: %w", p.m.Files[pl.file].Path, at, err)
		}
		at += int64(len(part))
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", p.m.Files[pl.file].Path, err)
	}
	return nil
}

// readAll reads r into b, reading at most maxStored+1 bytes, and after each read hands
// arrived (when not nil) all of b read so far.
func readAll(r io.Reader, b []byte, arrived func([]byte)) ([]byte, error) {
	lr := io.LimitReader(r, maxStored+1)
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := lr.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if arrived != nil && n > 0 {
			arrived(b)
		}
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

// sync makes every file and directory of the pulled image durable before it is renamed.
func (p *puller) sync(img string) error {
	for i := range p.m.Files {
		f, err := os.Open(p.path(i))
		if err == nil {
			err = f.Sync()
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			return fmt.Errorf("sync %s: %w", p.m.Files[i].Path, err)
		}
	}
	return filepath.WalkDir(img, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		return durable.SyncDir(path)
	})
}

func (p *puller) progress(n int64) {
	if p.o.Progress == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done += n
	p.o.Progress(p.done, p.total)
}
