package archive

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/gpucr/gpucr/internal/diskroom"
	"github.com/gpucr/gpucr/internal/durable"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/signing"
)

// Bounds on what an import writes besides the files the manifest lists, whose sizes it
// names: the manifest itself, its seal and signatures, CRIU's logs, directories.
const (
	maxManifest = 64 << 20
	maxSmall    = 1 << 20 // the seal, the signatures
	maxLog      = 64 << 20
	maxLogs     = 256 << 20
	maxLogFiles = 256 // CRIU writes a few: an archive of 200,000 empty ones took as many inodes
	maxDirs     = 4096
	// maxSkipped bounds an entry an import reads only to pass over it (podman's
	// config.dump and the like, a trusted image's logs): one declared 200 GiB in a few MB
	// of zstd held root's gpucr past SIGTERM while it read through (hostile test).
	maxSkipped = 64 << 20
)

// Import unpacks the archive gpucr exported at file into the new image directory dir,
// and verifies it as a restore verifies an image directory (with trusted keys, its
// signature too) before it appears at dir. The manifest, which comes first, is checked
// before any other byte is written, and each entry is refused as it comes unless it is a
// regular file the manifest lists, of the size it lists (or one of CRIU's logs), or a
// directory: no link, device or unlisted file is written, nothing outside dir. It is
// staged beside dir in staging (image.StagingPath of dir, which a caller journals before
// it exists), or at a fresh name when staging is "".
func Import(ctx context.Context, file, dir, staging string, trusted signing.Keys) (*image.Manifest, string, error) {
	dir = filepath.Clean(dir)
	parent := filepath.Dir(dir)
	if fi, err := os.Stat(parent); err != nil || !fi.IsDir() {
		return nil, "", fmt.Errorf("import %s: the parent directory of %s does not exist", file, dir)
	}
	if err := image.CheckFinal(dir); err != nil {
		return nil, "", err
	}
	if err := image.CheckParent(dir); err != nil {
		return nil, "", err
	}
	f, err := openArchive(file)
	if err != nil {
		return nil, "", fmt.Errorf("import %w", err)
	}
	defer f.Close()
	tmp := staging
	if tmp == "" {
		tmp, err = os.MkdirTemp(parent, "."+filepath.Base(dir)+partial+"*")
	} else {
		err = os.Mkdir(tmp, 0o700)
	}
	if err != nil {
		return nil, "", fmt.Errorf("import %s: %w", file, err)
	}
	defer os.RemoveAll(tmp)
	// The image is staged one level down, under a name an image may have (image.Load
	// refuses a directory named as a checkpoint's staging one).
	stage := filepath.Join(tmp, "image")
	if err := os.Mkdir(stage, 0o700); err != nil {
		return nil, "", fmt.Errorf("import %s: %w", file, err)
	}
	u := &unpacker{ctx: ctx, stage: stage, trusted: trusted, dirs: []string{stage}, buf: make([]byte, copyBlock)}
	if err := u.unpack(f); err != nil {
		return nil, "", fmt.Errorf("import %s: %w", file, err)
	}
	m, signer, err := image.OpenTrusted(stage, trusted)
	if err != nil {
		return nil, "", fmt.Errorf("import %s: %w", file, err)
	}
	for _, d := range u.dirs {
		if err := durable.SyncDir(d); err != nil {
			return nil, "", err
		}
	}
	// rename(2) replaces an empty directory at dir and fails on a non-empty one.
	if err := syscall.Rename(stage, dir); err != nil {
		if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
			return nil, "", fmt.Errorf("%w: %s", image.ErrNotEmpty, dir)
		}
		return nil, "", fmt.Errorf("import %s into %s: %w", file, dir, err)
	}
	return m, signer, durable.SyncDir(parent)
}

// unpacker writes an archive's entries into the staged image.
type unpacker struct {
	ctx     context.Context
	stage   string
	trusted signing.Keys
	m       *image.Manifest
	listed  map[string]int64
	dirs    []string
	logs    int64
	// logFiles counts CRIU's logs written.
	logFiles int
	buf      []byte // one block of a file being written
	// unchecked counts the bytes written since the room left on the file system was last
	// looked at.
	unchecked int64
}

// copyBlock is how much of a file is written (or left as a hole) at a time.
const copyBlock = 1 << 20

// checkEvery is how many bytes are written between looks at the room left.
const checkEvery = 16 << 20

// sparse says whether h is a sparse entry: tar readers give its holes as zeros, so a few
// bytes of archive make any number of bytes to write. gpucr's exports hold none.
func sparse(h *tar.Header) bool {
	if h.Typeflag == tar.TypeGNUSparse {
		return true
	}
	for k := range h.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

func (u *unpacker) unpack(r io.Reader) error {
	stream, _, closeFn, err := decompress(r)
	if err != nil {
		return &Refusal{Reason: err.Error()}
	}
	defer closeFn()
	tr := tar.NewReader(stream)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return &Refusal{Reason: "not a tar archive, or a damaged one: " + err.Error()}
		}
		if err := u.ctx.Err(); err != nil {
			return err
		}
		if err := u.entry(h, tr); err != nil {
			return err
		}
	}
	if u.m == nil {
		return u.noManifest()
	}
	return nil
}

func (u *unpacker) noManifest() error {
	return &Refusal{Reason: "no " + GpucrDir + "/" + image.ManifestName + " before the image's files: not a checkpoint gpucr exported " +
		"(a podman checkpoint is restored by podman container restore --import)"}
}

func (u *unpacker) entry(h *tar.Header, r io.Reader) error {
	p, ok := imagePath(h.Name)
	if !ok {
		return &Refusal{h.Name, "has no place in a gpucr export, which holds only checkpoint/, gpucr/, config.dump, spec.dump and stats-dump"}
	}
	if sparse(h) {
		return &Refusal{h.Name, "a sparse entry: gpucr's exports hold none"}
	}
	switch h.Typeflag {
	case tar.TypeReg:
	case tar.TypeDir:
		if p == "" {
			return nil
		}
		if len(u.dirs) >= maxDirs {
			return &Refusal{h.Name, fmt.Sprintf("more than %d directories", maxDirs)}
		}
		return u.mkdir(p)
	default:
		return &Refusal{h.Name, kind(h.Typeflag) + ": an image holds only regular files and directories"}
	}
	if p == "" {
		return u.skip(h, r) // written for podman and checkpointctl: a restore reads none of them
	}
	if u.m == nil {
		switch p {
		case image.ManifestName:
			return u.write(h.Name, p, r, h.Size, maxManifest)
		case image.SealName, image.SigName:
			return u.write(h.Name, p, r, h.Size, maxSmall)
		}
		if err := u.load(); err != nil {
			return err
		}
	}
	if size, ok := u.listed[p]; ok {
		if h.Size != size {
			return &Refusal{h.Name, fmt.Sprintf("%d bytes where the manifest lists %d", h.Size, size)}
		}
		return u.write(h.Name, p, r, h.Size, size)
	}
	if path.Dir(p) == image.LogsDir {
		if len(u.trusted) > 0 {
			return u.skip(h, r) // no signature covers them: a trusted image holds signed bytes only
		}
		if u.logFiles++; u.logFiles > maxLogFiles {
			return &Refusal{h.Name, fmt.Sprintf("more than %d of CRIU's logs", maxLogFiles)}
		}
		u.logs += h.Size
		if u.logs > maxLogs {
			return &Refusal{h.Name, fmt.Sprintf("CRIU's logs exceed %d MiB", maxLogs>>20)}
		}
		return u.write(h.Name, p, r, h.Size, maxLog)
	}
	return &Refusal{h.Name, "not listed in the image's manifest"}
}

// skip reads through an entry no image file comes from, a block at a time, stopping when
// the import is cancelled: left to the tar reader, the reading through went on past every
// signal. One larger than any such entry is refused unread.
func (u *unpacker) skip(h *tar.Header, r io.Reader) error {
	if h.Size > maxSkipped {
		return &Refusal{h.Name, fmt.Sprintf("%d bytes, more than %d MiB: none of gpucr's or podman's files beside an image is so large", h.Size, maxSkipped>>20)}
	}
	for {
		if err := u.ctx.Err(); err != nil {
			return err
		}
		if _, err := io.CopyN(io.Discard, r, copyBlock); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return &Refusal{h.Name, "damaged: " + err.Error()}
		}
	}
}

// load reads the manifest (and with trusted keys checks its signature) from what the
// archive gave so far: before anything else is written.
func (u *unpacker) load() error {
	m, _, err := image.LoadTrusted(u.stage, u.trusted)
	if errors.Is(err, image.ErrNoManifest) {
		return u.noManifest()
	}
	if err != nil {
		return err
	}
	u.m, u.listed = m, make(map[string]int64, len(m.Files))
	for _, f := range m.Files {
		u.listed[f.Path] = f.Size
	}
	return nil
}

func (u *unpacker) mkdir(p string) error {
	full := filepath.Join(u.stage, filepath.FromSlash(p))
	for d := full; d != u.stage; d = filepath.Dir(d) {
		if fi, err := os.Lstat(d); err == nil {
			if !fi.IsDir() {
				return &Refusal{p, "a directory where the archive has a file"}
			}
			break
		}
		u.dirs = append(u.dirs, d)
	}
	if err := os.MkdirAll(full, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", p, err)
	}
	return nil
}

// write writes entry name, at most limit bytes, as the image's file p.
func (u *unpacker) write(name, p string, r io.Reader, size, limit int64) error {
	if size > limit {
		return &Refusal{name, fmt.Sprintf("%d bytes, more than the %d this part may have", size, limit)}
	}
	if err := u.mkdir(path.Dir(p)); err != nil {
		return err
	}
	full := filepath.Join(u.stage, filepath.FromSlash(p))
	f, err := os.OpenFile(full, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return &Refusal{name, "appears twice"}
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	err = u.copy(name, f, io.LimitReader(r, size))
	if err == nil {
		err = f.Truncate(size) // a hole at the end is not written
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	return nil
}

// copy writes r into f block by block, leaving a block of zeros as a hole (memory gpucr saved
// holds many, and a compressed archive of zeros is tiny), and refuses to go on once the file
// system would be left with too little room for others.
func (u *unpacker) copy(name string, f *os.File, r io.Reader) error {
	for {
		if err := u.ctx.Err(); err != nil {
			return err
		}
		n, err := io.ReadFull(r, u.buf)
		if n > 0 {
			b := u.buf[:n]
			if allZero(b) {
				_, err = f.Seek(int64(n), io.SeekCurrent)
			} else {
				_, err = f.Write(b)
				u.unchecked += int64(n)
			}
			if err != nil {
				return err
			}
			if u.unchecked >= checkEvery {
				u.unchecked = 0
				if err := roomLeft(name, u.stage); err != nil {
					return err
				}
			}
		}
		switch {
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
			return nil
		case err != nil:
			return err
		}
	}
}

var zeroBlock = make([]byte, copyBlock)

func allZero(b []byte) bool { return bytes.Equal(b, zeroBlock[:len(b)]) }

// roomLeft refuses, as entry name is written, to fill the file system of dir past what it
// must keep free (diskroom.Keep).
func roomLeft(name, dir string) error {
	err := diskroom.Check(dir, 0)
	if full := (*diskroom.FullError)(nil); errors.As(err, &full) {
		return &Refusal{name, full.Error() + ": the image is larger than the room there"}
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}

// kind names a tar entry type that an image never holds.
func kind(t byte) string {
	switch t {
	case tar.TypeSymlink:
		return "a symbolic link"
	case tar.TypeLink:
		return "a hard link"
	case tar.TypeChar, tar.TypeBlock:
		return "a device"
	case tar.TypeFifo:
		return "a FIFO"
	}
	return fmt.Sprintf("of tar type %q", t)
}
