package archive

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/gpucr/gpucr/internal/durable"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/rootonly"
)

// Export is what an archive says about the container besides its image.
type Export struct {
	Config Config
	Spec   []byte // the container's OCI runtime spec as JSON: its bundle's config.json
}

// partial is in the name of an archive being written: FILE appears only whole, and a
// killed gpucr leaves only a hidden .FILE.partial-* beside it.
const partial = ".partial-"

// CheckDest refuses an archive destination that exists or whose directory does not, so
// that a checkpoint is refused before its container is stopped, not after. To gpucr
// running as root it also refuses a directory that others can change (a root-owned sticky
// one excepted), as for images: the archive is written under a temporary name and linked
// by name, and a user who could rename in that directory swapped their own archive in
// (hostile test), for a later restore --import to run as root.
func CheckDest(file string) error {
	if _, err := os.Lstat(file); err == nil {
		return fmt.Errorf("%s exists: gpucr does not overwrite an archive", file)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("archive %s: %w", file, err)
	}
	if fi, err := os.Stat(filepath.Dir(file)); err != nil || !fi.IsDir() {
		return fmt.Errorf("the directory of archive %s does not exist", file)
	}
	if os.Geteuid() == 0 {
		if err := rootonly.Walk(filepath.Dir(file)); err != nil {
			return fmt.Errorf("archive %s: %w: others could swap what root writes there; export into a directory only root can change", file, err)
		}
	}
	return nil
}

// Write packs the gpucr image at dir, which m describes, and e into a new archive at
// file, compressed as c, and returns its size. The archive is written to a temporary
// file beside file — staging (image.StagingPath of file, which a caller journals before
// it exists), or a fresh name when staging is "" — synced and linked into place: file
// appears whole or not at all, and an existing file is never replaced.
func Write(ctx context.Context, file, staging, dir string, m *image.Manifest, e Export, c Compression) (int64, error) {
	if err := CheckDest(file); err != nil {
		return 0, err
	}
	var tmp *os.File
	var err error
	if staging == "" {
		tmp, err = os.CreateTemp(filepath.Dir(file), "."+filepath.Base(file)+partial+"*")
	} else {
		tmp, err = os.OpenFile(staging, os.O_RDWR|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	}
	if err != nil {
		return 0, fmt.Errorf("write archive %s: %w", file, err)
	}
	defer os.Remove(tmp.Name()) // after the link, only the temporary name goes
	err = writeTo(ctx, tmp, dir, m, e, c)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("write archive %s: %w", file, err)
	}
	if err := os.Link(tmp.Name(), file); err != nil {
		return 0, fmt.Errorf("write archive %s: %w", file, err)
	}
	if err := durable.SyncDir(filepath.Dir(file)); err != nil {
		return 0, err
	}
	fi, err := os.Stat(file)
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

func writeTo(ctx context.Context, w io.Writer, dir string, m *image.Manifest, e Export, c Compression) error {
	var compressed io.WriteCloser
	switch c {
	case Gzip:
		compressed = gzip.NewWriter(w)
	case Zstd:
		z, err := zstd.NewWriter(w)
		if err != nil {
			return err
		}
		compressed = z
	case None, "":
	default:
		return fmt.Errorf("unknown compression %q", c)
	}
	if compressed != nil {
		w = compressed
	}
	tw := tar.NewWriter(w)
	files, err := entries(dir)
	if err != nil {
		return err
	}
	for _, d := range []string{CheckpointDir, GpucrDir} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o700, ModTime: m.Created}); err != nil {
			return err
		}
	}
	// The manifest first: an import checks it, and the signature, before it writes a byte
	// of the image, and refuses each file it does not list as it comes.
	for _, p := range []string{image.ManifestName, image.SealName, image.SigName} {
		if slices.Contains(files, p) {
			if err := addFile(ctx, tw, dir, p, archivePath(p)); err != nil {
				return err
			}
		}
	}
	config, err := json.MarshalIndent(e.Config, "", "  ")
	if err != nil {
		return err
	}
	for _, part := range []struct {
		name string
		b    []byte
	}{{ConfigDump, append(config, '\n')}, {SpecDump, e.Spec}} {
		name, b := part.name, part.b
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o600, Size: int64(len(b)), ModTime: m.Created}); err != nil {
			return err
		}
		if _, err := tw.Write(b); err != nil {
			return err
		}
	}
	stats := image.LogsDir + "/" + StatsDump
	if slices.Contains(files, stats) {
		if err := addFile(ctx, tw, dir, stats, StatsDump); err != nil {
			return err
		}
	}
	for _, p := range files {
		if p == image.ManifestName || p == image.SealName || p == image.SigName {
			continue
		}
		if err := addFile(ctx, tw, dir, p, archivePath(p)); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if compressed != nil {
		return compressed.Close()
	}
	return nil
}

// entries lists the regular files of the image at dir as slash paths, in lexical order.
// An image holds nothing else: anything else is refused.
func entries(dir string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return nil
		case !d.Type().IsRegular():
			return fmt.Errorf("%s is not a regular file: an image holds only regular files and directories", rel)
		}
		out = append(out, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list image %s: %w", dir, err)
	}
	return out, nil
}

// addFile writes the image's file p as the archive entry name.
func addFile(ctx context.Context, tw *tar.Writer, dir, p, name string) error {
	f, err := os.Open(filepath.Join(dir, filepath.FromSlash(p)))
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	h := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o600, Size: fi.Size(), ModTime: fi.ModTime()}
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	if _, err := io.Copy(tw, ctxReader{ctx, f}); err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	return nil
}

// ctxReader stops a copy once ctx is done: Ctrl-C during a long export.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
