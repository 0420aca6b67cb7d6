package image

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// ErrNotEmpty means the image directory already holds something: gpucr never overwrites.
var ErrNotEmpty = errors.New("image directory is not empty")

// Staging is an image being written. It lives in a hidden directory beside its final
// place and becomes the image only by Commit's rename, so a crash leaves no image.
type Staging struct {
	dir, final string
	committed  bool
}

// Begin checks that final can receive an image and creates its staging directory.
func Begin(final string) (*Staging, error) {
	final = filepath.Clean(final)
	if fi, err := os.Stat(final); err == nil {
		if !fi.IsDir() {
			return nil, fmt.Errorf("image directory %s exists and is not a directory", final)
		}
		entries, err := os.ReadDir(final)
		if err != nil {
			return nil, fmt.Errorf("read image directory %s: %w", final, err)
		}
		if len(entries) > 0 {
			return nil, fmt.Errorf("%w: %s", ErrNotEmpty, final)
		}
	}
	parent, base := filepath.Dir(final), filepath.Base(final)
	dir, err := os.MkdirTemp(parent, "."+base+".partial-")
	if err != nil {
		return nil, fmt.Errorf("image directory %s is not writable: %w", final, err)
	}
	for _, sub := range []string{CRIUDir, LogsDir} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o700); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("create %s in %s: %w", sub, dir, err)
		}
	}
	return &Staging{dir: dir, final: final}, nil
}

// Dir is the staging directory; CRIUDir and LogsDir are the places inside it for CRIU.
func (s *Staging) Dir() string     { return s.dir }
func (s *Staging) CRIUDir() string { return filepath.Join(s.dir, CRIUDir) }
func (s *Staging) LogsDir() string { return filepath.Join(s.dir, LogsDir) }

// Commit checksums every staged file into m, writes the manifest, makes everything durable
// and renames the staging directory into place: the image appears whole or not at all.
func (s *Staging) Commit(m *Manifest) error {
	paths, err := regularFiles(s.dir)
	if err != nil {
		return err
	}
	files, err := sumFiles(s.dir, paths)
	if err != nil {
		return err
	}
	m.FormatVersion = FormatVersion
	m.Files = files
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("encode manifest: %w", err)
	}
	if err := writeSynced(filepath.Join(s.dir, ManifestName), b); err != nil {
		return err
	}
	if err := syncTree(s.dir, paths); err != nil {
		return err
	}
	if err := os.Remove(s.final); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("replace empty %s: %w", s.final, err)
	}
	if err := os.Rename(s.dir, s.final); err != nil {
		return fmt.Errorf("commit image to %s: %w", s.final, err)
	}
	s.committed = true
	return syncDir(filepath.Dir(s.final))
}

// Abort removes the staging directory; after Commit it does nothing.
func (s *Staging) Abort() error {
	if s.committed {
		return nil
	}
	if err := os.RemoveAll(s.dir); err != nil {
		return fmt.Errorf("remove partial image %s: %w", s.dir, err)
	}
	return nil
}

// regularFiles lists the files under dir as slash paths, the manifest excluded. Anything
// but regular files and directories is refused: restore could not trust it.
func regularFiles(dir string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case d.IsDir():
			return nil
		case !d.Type().IsRegular():
			return fmt.Errorf("image file %s is not a regular file", rel)
		case rel == ManifestName:
			return nil
		}
		out = append(out, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list image files: %w", err)
	}
	sort.Strings(out)
	return out, nil
}

func writeSynced(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync %s: %w", path, err)
	}
	return f.Close()
}

// syncTree makes the staged files and their directories durable before the rename.
func syncTree(dir string, paths []string) error {
	dirs := map[string]bool{dir: true}
	for _, p := range paths {
		full := filepath.Join(dir, filepath.FromSlash(p))
		f, err := os.Open(full)
		if err != nil {
			return fmt.Errorf("sync %s: %w", p, err)
		}
		err = f.Sync()
		f.Close()
		if err != nil {
			return fmt.Errorf("sync %s: %w", p, err)
		}
		dirs[filepath.Dir(full)] = true
	}
	for d := range dirs {
		if err := syncDir(d); err != nil {
			return err
		}
	}
	return nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil && !strings.Contains(err.Error(), "invalid argument") {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
