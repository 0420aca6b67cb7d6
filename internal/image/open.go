package image

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/cespare/xxhash/v2"
)

// Errors a restore refuses an image for.
var (
	ErrNoManifest  = errors.New("not a gpucr image")
	ErrNewerFormat = errors.New("image format is newer than this gpucr")
	ErrCorrupt     = errors.New("image is corrupted")
)

// CorruptError names the file of an image that is wrong and how.
type CorruptError struct {
	Path, Reason string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("image file %s: %s", e.Path, e.Reason)
}

func (e *CorruptError) Is(target error) bool { return target == ErrCorrupt }

// Load reads and checks an image's manifest, not its files.
func Load(dir string) (*Manifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, ManifestName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s has no %s", ErrNoManifest, dir, ManifestName)
	}
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, &CorruptError{ManifestName, "unreadable: " + err.Error()}
	}
	switch {
	case m.FormatVersion > FormatVersion:
		return nil, fmt.Errorf("%w: %s is format %d, this gpucr reads up to %d; upgrade gpucr",
			ErrNewerFormat, dir, m.FormatVersion, FormatVersion)
	case m.FormatVersion < 1 || len(m.Files) == 0 || m.RootPID <= 0:
		return nil, &CorruptError{ManifestName, "missing format version, root PID or file list"}
	}
	for _, f := range m.Files {
		clean := path.Clean(f.Path)
		if clean != f.Path || path.IsAbs(clean) || clean == ".." || strings.HasPrefix(clean, "../") {
			return nil, &CorruptError{ManifestName, fmt.Sprintf("file path %q leaves the image", f.Path)}
		}
	}
	return &m, nil
}

// Verify checks every file of m in dir: sizes first, so a truncated image fails without
// being read, then checksums, in parallel.
func Verify(dir string, m *Manifest) error {
	for _, f := range m.Files {
		fi, err := os.Stat(filepath.Join(dir, filepath.FromSlash(f.Path)))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return &CorruptError{f.Path, "missing"}
		case err != nil:
			return fmt.Errorf("verify %s: %w", f.Path, err)
		case fi.Size() != f.Size:
			return &CorruptError{f.Path, fmt.Sprintf("size %d, want %d (truncated or changed)", fi.Size(), f.Size)}
		}
	}
	paths := make([]string, len(m.Files))
	for i, f := range m.Files {
		paths[i] = f.Path
	}
	got, err := sumFiles(dir, paths)
	if err != nil {
		return err
	}
	for i, f := range m.Files {
		if got[i].XXH64 != f.XXH64 {
			return &CorruptError{f.Path, fmt.Sprintf("checksum mismatch (want %s, got %s)", f.XXH64, got[i].XXH64)}
		}
	}
	return nil
}

// Open loads an image and verifies all its files: what restore accepts.
func Open(dir string) (*Manifest, error) {
	m, err := Load(dir)
	if err != nil {
		return nil, err
	}
	if err := Verify(dir, m); err != nil {
		return nil, err
	}
	return m, nil
}

// sumFiles sizes and hashes paths (slash, relative to dir) on all cores, in order.
func sumFiles(dir string, paths []string) ([]File, error) {
	out := make([]File, len(paths))
	errs := make([]error, len(paths))
	work := make(chan int)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				out[i], errs[i] = sumFile(dir, paths[i])
			}
		}()
	}
	for i := range paths {
		work <- i
	}
	close(work)
	wg.Wait()
	return out, errors.Join(errs...)
}

func sumFile(dir, p string) (File, error) {
	f, err := os.Open(filepath.Join(dir, filepath.FromSlash(p)))
	if err != nil {
		return File{}, fmt.Errorf("checksum %s: %w", p, err)
	}
	defer f.Close()
	h := xxhash.New()
	n, err := io.CopyBuffer(h, f, make([]byte, 1<<20))
	if err != nil {
		return File{}, fmt.Errorf("checksum %s: %w", p, err)
	}
	return File{Path: p, Size: n, XXH64: fmt.Sprintf("%016x", h.Sum64())}, nil
}
