package archive

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"
	"time"

	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/image"
)

// Contents is an archive read in one pass for inspect: its small files held in memory,
// the large ones (memory pages, gpucr's mem/, a root filesystem diff) passed over.
type Contents struct {
	Compression Compression `json:"compression"`
	// Gpucr says whether gpucr exported it (a manifest under gpucr/); otherwise it is
	// podman's (or another engine's) checkpoint archive.
	Gpucr  bool    `json:"gpucr"`
	Config *Config `json:"config,omitempty"`
	// Bytes is the size of the archive's files, uncompressed.
	Bytes int64 `json:"bytes"`

	files map[string][]byte
}

// The files inspect reads are metadata: an archive that holds more than maxHeld of them is
// refused. Each held file counts its name too, and heldEntry for its place in the map, so
// that many files of long names or of no bytes are bounded as well.
const (
	maxHeld   = 512 << 20
	heldEntry = 512
)

// held says whether inspect keeps the archive's file name in memory: CRIU's images but
// those that carry content, and the metadata beside them.
func held(name string) bool {
	if rest, ok := strings.CutPrefix(name, CheckpointDir+"/"); ok {
		return !carriesContent(path.Base(rest))
	}
	switch name {
	case ConfigDump, SpecDump, StatsDump,
		GpucrDir + "/" + image.ManifestName, GpucrDir + "/" + image.SealName, GpucrDir + "/container.json":
		return true
	}
	return false
}

// carriesContent says whether a CRIU image of that name carries the processes' bytes rather
// than their description: memory pages, a tmpfs mount's contents (a container's /dev/shm),
// a deleted file CRIU carries. inspect needs none of them, and they are as large as what
// they hold: a container's 100 MB /dev/shm was refused as metadata (review).
func carriesContent(base string) bool {
	return strings.HasPrefix(base, "pages-") || strings.HasPrefix(base, "amdgpu-pages-") ||
		(strings.HasPrefix(base, "tmpfs-") && strings.HasSuffix(base, ".tar.gz.img")) || strings.HasPrefix(base, "ghost-file-")
}

// bulk says whether the archive's file name may be larger than maxSkipped: what CRIU's
// images carry (carriesContent), gpucr's mem/, and what podman keeps beside a checkpoint
// (the container's root file system changes, volumes, /dev/shm, log). The rest of
// checkpoint/ and gpucr/ is metadata, as are config.dump, spec.dump and stats-dump.
func bulk(name string) bool {
	if strings.HasPrefix(name, GpucrDir+"/") {
		return strings.HasPrefix(name, GpucrDir+"/"+criuimg.MemDir+"/")
	}
	return !held(name)
}

// Read reads the archive at file, plain or compressed with gzip or zstd, without writing
// any of it out.
func Read(file string) (*Contents, error) {
	f, err := openArchive(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	stream, c, closeFn, err := decompress(f)
	if err != nil {
		return nil, fmt.Errorf("read archive %s: %w", file, err)
	}
	defer closeFn()
	out := &Contents{Compression: c, files: map[string][]byte{}}
	var total int64
	tr := tar.NewReader(stream)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read archive %s: not a tar archive, or a damaged one: %w", file, err)
		}
		name := strings.TrimPrefix(h.Name, "./")
		regular := h.Typeflag == tar.TypeReg && isLocal(name)
		// An entry passed over is decompressed all the same: one declared 200 GiB in 6.5 MB
		// of zstd held inspect for two minutes (hostile test).
		if h.Size > maxSkipped && (!regular || !bulk(name)) {
			return nil, fmt.Errorf("read archive %s: %w", file, &Refusal{h.Name, fmt.Sprintf("%d bytes, more than %d MiB: "+
				"only a checkpoint's memory and podman's copies of the container's files are so large", h.Size, maxSkipped>>20)})
		}
		if !regular {
			continue
		}
		out.Bytes += h.Size
		if !held(name) {
			continue
		}
		// Names are held as the map's keys, and each file in a slice of its size (io.ReadAll
		// kept 512 bytes for an empty one): 2,000 empty files named by a megabyte each took
		// 2.8 GB (hostile test).
		if total += heldEntry + int64(len(name)) + h.Size; total > maxHeld {
			return nil, fmt.Errorf("read archive %s: more than %d MiB of CRIU metadata and its names: not a checkpoint inspect can hold in memory", file, maxHeld>>20)
		}
		b := make([]byte, h.Size)
		if _, err := io.ReadFull(tr, b); err != nil {
			return nil, fmt.Errorf("read archive %s: %s: %w", file, name, err)
		}
		out.files[name] = b
	}
	if _, ok := out.files[CheckpointDir+"/pstree.img"]; !ok {
		return nil, fmt.Errorf("%s is not a checkpoint archive: no %s/pstree.img", file, CheckpointDir)
	}
	_, out.Gpucr = out.files[GpucrDir+"/"+image.ManifestName]
	if b, ok := out.files[ConfigDump]; ok {
		out.Config = &Config{}
		if err := json.Unmarshal(b, out.Config); err != nil {
			return nil, fmt.Errorf("read %s of %s: %w", ConfigDump, file, err)
		}
	}
	return out, nil
}

// Manifest is the gpucr manifest the archive holds, checked against its seal.
func (c *Contents) Manifest() (*image.Manifest, error) {
	return image.Parse(c.files[GpucrDir+"/"+image.ManifestName], c.files[GpucrDir+"/"+image.SealName])
}

// File is the archive's held file name; fs.ErrNotExist if it has none.
func (c *Contents) File(name string) ([]byte, error) {
	b, ok := c.files[name]
	if !ok {
		return nil, fmt.Errorf("%s: %w", name, fs.ErrNotExist)
	}
	return b, nil
}

// CRIU is the archive's checkpoint/ directory, for criuimg.ReadFS.
func (c *Contents) CRIU() fs.FS { return memFS{c.files, CheckpointDir + "/"} }

// Top is the archive's top directory (stats-dump), for criuimg.ReadDumpStatsFS.
func (c *Contents) Top() fs.FS { return memFS{c.files, ""} }

// memFS serves the held files under prefix, flat: CRIU's image directory has no
// subdirectories that inspect reads.
type memFS struct {
	files  map[string][]byte
	prefix string
}

func (m memFS) Open(name string) (fs.File, error) {
	b, ok := m.files[m.prefix+name]
	if !ok || !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	return &memFile{Reader: bytes.NewReader(b), name: name, size: int64(len(b))}, nil
}

type memFile struct {
	*bytes.Reader
	name string
	size int64
}

func (f *memFile) Stat() (fs.FileInfo, error) { return f, nil }
func (f *memFile) Close() error               { return nil }
func (f *memFile) Name() string               { return path.Base(f.name) }
func (f *memFile) Size() int64                { return f.size }
func (f *memFile) Mode() fs.FileMode          { return 0o400 }
func (f *memFile) ModTime() time.Time         { return time.Time{} }
func (f *memFile) IsDir() bool                { return false }
func (f *memFile) Sys() any                   { return nil }
