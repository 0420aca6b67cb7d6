// Package chunked stores gpucr images in a store.Store as content-addressed, compressed
// chunks plus one manifest object per checkpoint.
//
// Layout, for a checkpoint at key PREFIX (e.g. jobs/train/ckpt-3):
//
//	PREFIX/gpucr-checkpoint.json    the object manifest: gpucr's image manifest and, per file, its chunks
//	dir(PREFIX)/chunks/<sha256>     one zstd frame per distinct non-zero chunk, keyed by the sha256 of its content
//
// Checkpoints that sit side by side share their chunks/ directory, so a second checkpoint
// of the same workload uploads only the chunks that changed. The manifest object is
// written last, and only it makes a checkpoint exist: an interrupted push leaves at most
// unreferenced chunks, never something that lists as complete or that pull accepts.
package chunked

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/store"
)

// ChunkSize is the largest chunk, the store's unit of deduplication: smaller finds more
// unchanged memory between checkpoints, larger means fewer objects (docs/storage.md). CRIU's
// pages-*.img files are cut where their pages' virtual addresses cross a ChunkSize boundary
// (see pageCuts); other files every ChunkSize bytes, so files smaller than this are one chunk.
// It is image.HashChunkSize, the image's unit of checksumming, so that a chunk of gpucr's
// memory files is one piece of the image and the chunk's xxh64 is the piece's: it is taken
// once, not twice, on its way to the store and back (samePiece). Checkpoints stored with
// smaller chunks (4 MiB before) are read as they are.
const ChunkSize = image.HashChunkSize

// FormatVersion is the object manifest format this build writes and reads.
const FormatVersion = 1

// ManifestObject is the manifest object's name under a checkpoint's prefix.
const ManifestObject = "gpucr-checkpoint.json"

// ChunksDir is the name of the directory, beside checkpoints, that holds their chunks.
const ChunksDir = "chunks"

// Bounds on the files a manifest may list, each of which a pull creates: a crafted one of
// 200,000 empty files took as many inodes (hostile test). CRIU writes about six files per
// process and one per thread (18 for a process of 7 threads), and gpucr's memory files
// hold up to 256 MiB each (4,096 a terabyte), so maxFiles is thousands of processes of
// dozens of threads; CRIU's logs are a few, bounded as an import bounds them.
const (
	maxFiles    = 100_000
	maxLogFiles = 256
)

// compression names the one codec this format uses.
const compression = "zstd"

// Errors callers act on.
var (
	// ErrNoCheckpoint means no complete checkpoint is at a prefix: nothing was pushed there,
	// or a push was interrupted before its manifest object was written.
	ErrNoCheckpoint = errors.New("no complete checkpoint")
	// ErrExists means a push found a checkpoint at its prefix already; pushes never replace one.
	// Its text says what to do, as a bare "already exists" did not (documentation walk).
	ErrExists = errors.New("a checkpoint already exists: give a new location, or delete that one first with gpucr rm")
	// ErrBadManifest means a manifest object cannot be used.
	ErrBadManifest = errors.New("invalid checkpoint manifest")
	// ErrNewerFormat means a manifest object was written by a newer gpucr.
	ErrNewerFormat = errors.New("checkpoint format is newer than this gpucr")
	// ErrBadChunk is what every ChunkError matches.
	ErrBadChunk = errors.New("bad chunk")
)

// Manifest is the object manifest of one checkpoint.
type Manifest struct {
	Format      int       `json:"format"`
	ChunkSize   int64     `json:"chunkSize"`
	Compression string    `json:"compression"`
	Pushed      time.Time `json:"pushed"`
	// Image is the image's own manifest, decoded so that listing needs no other object;
	// manifest.json itself is among Files and comes back byte-identical.
	Image image.Manifest `json:"image"`
	Files []File         `json:"files"`
}

// File is one file of the image and the chunks that make it up, in order.
type File struct {
	Path   string  `json:"path"` // slash-separated, relative to the image directory
	Size   int64   `json:"size"`
	Chunks []Chunk `json:"chunks"`
}

// Chunk is one piece of a file. A zero chunk is all zero bytes: it is recorded, not stored.
type Chunk struct {
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256,omitempty"`
	// XXH64 is what a fetch checks the chunk's bytes against: a tenth of the SHA-256's
	// cost, which halved the CPU time of a streamed fill. The SHA-256 names the chunk (and
	// dedups it); it is checked instead only where a manifest object has no XXH64 (written
	// before 2026-11-26). Neither is what makes a signed image trustworthy: the image's own
	// manifest, signed, holds the SHA-256 of every byte, which the restore checks.
	XXH64 string `json:"xxh64,omitempty"`
	// Stored is the compressed size of the chunk's object.
	Stored int64 `json:"stored,omitempty"`
	Zero   bool  `json:"zero,omitempty"`
}

// StoredBytes is the compressed size of the distinct chunks the checkpoint references.
func (m *Manifest) StoredBytes() int64 {
	seen := map[string]bool{}
	var n int64
	for _, f := range m.Files {
		for _, c := range f.Chunks {
			if !c.Zero && !seen[c.SHA256] {
				seen[c.SHA256] = true
				n += c.Stored
			}
		}
	}
	return n
}

// ManifestKey is the key of the manifest object of the checkpoint at prefix.
func ManifestKey(prefix string) string { return prefix + "/" + ManifestObject }

// ChunkKey is the key of the chunk with the given sha256 for the checkpoint at prefix.
func ChunkKey(prefix, sum string) string {
	return chunksKey(ParentDir(prefix)) + "/" + sum
}

// ParentDir is the store directory a checkpoint at prefix sits in ("" at the top): its
// chunks and leases are there, shared with its siblings.
func ParentDir(prefix string) string {
	if dir := path.Dir(prefix); dir != "." {
		return dir
	}
	return ""
}

// chunksKey is the chunks directory of the store directory dir.
func chunksKey(dir string) string {
	if dir == "" {
		return ChunksDir
	}
	return dir + "/" + ChunksDir
}

// ErrBadName is a name no checkpoint can have: the request, not the store, is wrong.
var ErrBadName = errors.New("not a name a checkpoint can have")

// nameError says why a name is no checkpoint's; it is an ErrBadName.
type nameError struct{ reason string }

func (e *nameError) Error() string        { return e.reason }
func (e *nameError) Is(target error) bool { return target == ErrBadName }

// checkPrefix refuses prefixes a checkpoint cannot live at, by their name alone: none, one
// named after what its siblings share, or one inside a leases directory, a name only gpucr
// gives. One inside a store's chunks directory is checkPlace's to find.
func checkPrefix(prefix string) error {
	if prefix == "" {
		return &nameError{"a checkpoint needs a name: give s3://BUCKET/NAME or a path, not a bucket or /"}
	}
	if base := path.Base(prefix); base == ChunksDir || base == LeasesDir {
		return &nameError{fmt.Sprintf("a checkpoint cannot be named %q: that name is kept for what its siblings share", base)}
	}
	if slices.Contains(strings.Split(prefix, "/"), LeasesDir) {
		return &nameError{fmt.Sprintf("a checkpoint cannot live under a directory named %q: that name is kept for what a store's checkpoints share", LeasesDir)}
	}
	return nil
}

// checkPlace refuses a checkpoint inside the chunks directory of a store, at any depth
// (one that holds chunks): the checkpoint would make that directory hold what is no chunk,
// and every later collection there would refuse to run (hostile test). A directory of the
// user's that happens to be named chunks, holding no chunk, takes checkpoints like any
// other; one that becomes a store's chunks directory only later is gc's to refuse, naming
// what it holds.
func checkPlace(ctx context.Context, st store.Store, prefix string) error {
	// Nor in a local image: its manifest would not list what the store adds (hostile test:
	// checkpoint -D X --to X said it succeeded, and X no longer verified).
	if _, local := st.(*store.Dir); local {
		if img, inside := image.Holding(st.URL(prefix)); inside {
			return &nameError{fmt.Sprintf("a checkpoint cannot be stored at %s: it is inside the image %s, which it would change", st.URL(prefix), img)}
		}
	}
	// Nor at a store's own directory: the chunks go to the directory above the checkpoint's,
	// and the checkpoint would hide from ls the ones the store holds (a user's --to naming
	// the store wrote 403 MiB of chunks into the directory above it).
	entries, err := st.List(ctx, prefix)
	if err != nil && !errors.Is(err, store.ErrNotFound) && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if slices.ContainsFunc(entries, func(e store.Entry) bool { return e.Dir && e.Name() == ChunksDir }) {
		return &nameError{fmt.Sprintf("%s is a store's directory (it holds %s/): name a checkpoint in it, as %s/NAME", st.URL(prefix), ChunksDir, st.URL(prefix))}
	}
	parts := strings.Split(prefix, "/")
	for i := range len(parts) - 1 {
		if parts[i] != ChunksDir {
			continue
		}
		dir := strings.Join(parts[:i+1], "/")
		entries, err := st.List(ctx, dir)
		if err != nil {
			return err
		}
		if slices.ContainsFunc(entries, func(e store.Entry) bool { return !e.Dir && image.IsSHA256(e.Name()) }) {
			return &nameError{fmt.Sprintf("a checkpoint cannot live in %s: it holds the chunks of the store at %s", st.URL(dir), st.URL(ParentDir(dir)))}
		}
	}
	return nil
}

// problem says what makes a manifest unusable, or "" if nothing does. A pull writes the
// files it names, so their paths must stay inside the image directory, and the chunks
// must add up to each file. A chunk is its content: listed again under its sha256, it has
// the same size and xxh64, or a pull (which fetches it once and writes it wherever it is
// listed) would write more than the files' sizes say.
func (m *Manifest) problem() string {
	switch {
	case m.Format < 1:
		return fmt.Sprintf("format %d: no gpucr wrote it", m.Format)
	case m.ChunkSize <= 0 || m.ChunkSize > ChunkSize:
		return fmt.Sprintf("chunk size %d: not one gpucr writes", m.ChunkSize)
	case m.Compression != compression:
		return fmt.Sprintf("unknown compression %q", m.Compression)
	case len(m.Files) == 0:
		return "no files listed"
	case len(m.Files) > maxFiles:
		return fmt.Sprintf("%d files listed, more than the %d a checkpoint has", len(m.Files), maxFiles)
	}
	seen := map[string]bool{}
	chunks := map[string]Chunk{}
	logs := 0
	for _, f := range m.Files {
		if !filepath.IsLocal(f.Path) || path.Clean(f.Path) != f.Path {
			return fmt.Sprintf("file path %q is not inside the image", f.Path)
		}
		if strings.HasPrefix(f.Path, image.LogsDir+"/") {
			if logs++; logs > maxLogFiles {
				return fmt.Sprintf("over %d of CRIU's logs listed: CRIU writes a few", maxLogFiles)
			}
		}
		if seen[f.Path] {
			return fmt.Sprintf("file %s is listed twice", f.Path)
		}
		seen[f.Path] = true
		var total int64
		for _, c := range f.Chunks {
			if c.Size <= 0 || c.Size > ChunkSize || c.Stored < 0 || (!c.Zero && !image.IsSHA256(c.SHA256)) || (c.XXH64 != "" && !image.IsXXH64(c.XXH64)) {
				return fmt.Sprintf("file %s has an invalid chunk", f.Path)
			}
			if !c.Zero {
				if first, ok := chunks[c.SHA256]; ok && (first.Size != c.Size || first.XXH64 != c.XXH64) {
					return fmt.Sprintf("file %s lists chunk %s with another size or digest than before", f.Path, c.SHA256)
				}
				chunks[c.SHA256] = c
			}
			total += c.Size
		}
		if total != f.Size {
			return fmt.Sprintf("file %s: chunks add up to %d bytes, want %d", f.Path, total, f.Size)
		}
	}
	if !seen[image.ManifestName] {
		return "no " + image.ManifestName + " among the files"
	}
	return ""
}

// ChunkError names a chunk that a pull could not use and the file it belongs to.
type ChunkError struct {
	URL    string // the chunk object
	File   string
	Offset int64
	Reason string
}

func (e *ChunkError) Error() string {
	return fmt.Sprintf("chunk %s (%s at offset %d): %s", e.URL, e.File, e.Offset, e.Reason)
}

// Is makes errors.Is(err, ErrBadChunk) true for every ChunkError.
func (e *ChunkError) Is(target error) bool { return target == ErrBadChunk }
