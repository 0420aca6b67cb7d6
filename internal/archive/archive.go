// Package archive packs a gpucr container image into the checkpoint archive that podman
// exports and checkpointctl reads, unpacks such an archive back into a verified image, and
// reads one (gpucr's or podman's) in a single pass, without writing it out, for inspect.
//
// The layout is podman's: CRIU's files under checkpoint/, the container's description in
// config.dump and its OCI runtime spec in spec.dump, CRIU's statistics in stats-dump.
// What only gpucr reads (its manifest, seal and signatures, container.json, the memory it
// saved itself in mem/, CRIU's logs) is under gpucr/, which checkpointctl passes over.
// gpucr writes nothing it cannot fill truthfully: no rootfs-diff.tar (restore uses the
// bundle's root filesystem as it is), no network.status (runc containers have no network
// that gpucr set up).
package archive

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"syscall"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/gpucr/gpucr/internal/image"
)

// The names of the archive's parts.
const (
	CheckpointDir = "checkpoint"  // CRIU's files: the image's criu/
	GpucrDir      = "gpucr"       // the rest of the gpucr image
	ConfigDump    = "config.dump" // the container, in podman's form
	SpecDump      = "spec.dump"   // the container's OCI runtime spec
	StatsDump     = "stats-dump"  // CRIU's dump statistics, where checkpointctl looks
)

// Config is config.dump: the fields of podman's container description that gpucr knows
// for a runc container, and that checkpointctl shows.
type Config struct {
	ID string `json:"id"`
	// Name and RootfsImageName are podman's: a runc container has neither, so gpucr
	// leaves them empty; they are read from podman's archives.
	Name            string    `json:"name,omitempty"`
	RootfsImageName string    `json:"rootfsImageName,omitempty"`
	Runtime         string    `json:"runtime,omitempty"`
	Created         time.Time `json:"createdTime"`
	Checkpointed    time.Time `json:"checkpointedTime"`
}

// Compression is how an archive's tar stream is compressed.
type Compression string

const (
	None Compression = "none"
	Gzip Compression = "gzip"
	Zstd Compression = "zstd"
)

// CompressionFor is the compression a file name asks for by its extension, as tar's
// --auto-compress reads it: .gz or .tgz gzip, .zst or .tzst zstd, anything else none.
func CompressionFor(name string) Compression {
	switch {
	case strings.HasSuffix(name, ".gz"), strings.HasSuffix(name, ".tgz"):
		return Gzip
	case strings.HasSuffix(name, ".zst"), strings.HasSuffix(name, ".tzst"):
		return Zstd
	}
	return None
}

// openArchive opens the archive at file only if it is a regular file: opening a FIFO put in
// its place would wait for a writer for ever, deaf to SIGTERM (a hostile test).
func openArchive(file string) (*os.File, error) {
	f, err := os.OpenFile(file, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("%s is not a regular file", file)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// decompress returns the tar stream of r, decompressed by what its first bytes say it is,
// and the compression found. close releases the decompressor.
func decompress(r io.Reader) (tarStream io.Reader, c Compression, closeFn func(), err error) {
	br := bufio.NewReaderSize(r, 1<<20)
	head, _ := br.Peek(4)
	switch {
	case bytes.HasPrefix(head, []byte{0x1f, 0x8b}):
		z, err := gzip.NewReader(br)
		if err != nil {
			return nil, "", nil, fmt.Errorf("read gzip stream: %w", err)
		}
		return z, Gzip, func() { z.Close() }, nil
	case bytes.Equal(head, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		// A window past zstd's own default limit (128 MiB) costs that much memory to read
		// and is never what gpucr or podman writes.
		z, err := zstd.NewReader(br, zstd.WithDecoderMaxWindow(1<<27))
		if err != nil {
			return nil, "", nil, fmt.Errorf("read zstd stream: %w", err)
		}
		return z, Zstd, z.Close, nil
	}
	return br, None, func() {}, nil
}

// Refusal is an archive that is not taken, and why: a user reads it as one line.
type Refusal struct {
	Entry, Reason string
}

func (r *Refusal) Error() string {
	if r.Entry == "" {
		return "archive refused: " + r.Reason
	}
	return fmt.Sprintf("archive refused: entry %s: %s", r.Entry, r.Reason)
}

// ErrRefused matches every *Refusal with errors.Is.
var ErrRefused = errors.New("archive refused")

func (r *Refusal) Is(target error) bool { return target == ErrRefused }

// imagePath maps an archive entry's name to its path in the gpucr image, "" for the parts
// gpucr writes for others (config.dump, spec.dump, stats-dump) and the two top directories.
// ok is false for a name that has no place in a gpucr export.
func imagePath(name string) (p string, ok bool) {
	name = strings.TrimPrefix(name, "./")
	name = strings.TrimSuffix(name, "/")
	if name == "" || !isLocal(name) {
		return "", false
	}
	switch name {
	case CheckpointDir, GpucrDir, ConfigDump, SpecDump, StatsDump:
		return "", true
	}
	if rest, ok := strings.CutPrefix(name, CheckpointDir+"/"); ok {
		return image.CRIUDir + "/" + rest, true
	}
	if rest, ok := strings.CutPrefix(name, GpucrDir+"/"); ok {
		// CRIU's files have one place only: a gpucr/criu/ would shadow checkpoint/.
		if rest == image.CRIUDir || strings.HasPrefix(rest, image.CRIUDir+"/") {
			return "", false
		}
		return rest, true
	}
	return "", false
}

// archivePath is the entry name of the image's file p.
func archivePath(p string) string {
	if rest, ok := strings.CutPrefix(p, image.CRIUDir+"/"); ok {
		return CheckpointDir + "/" + rest
	}
	return GpucrDir + "/" + p
}

// isLocal says whether name is a clean relative slash path that stays below its root.
func isLocal(name string) bool {
	return path.Clean(name) == name && !path.IsAbs(name) && name != ".." && !strings.HasPrefix(name, "../") &&
		!strings.Contains(name, "\x00")
}
