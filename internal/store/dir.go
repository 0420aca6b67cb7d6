package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/gpucr/gpucr/internal/durable"
)

// tmpMark is in the name of every file Dir is still writing; List hides them, so an
// interrupted write is never seen as an object.
const tmpMark = ".tmp-"

// Dir is a store in a local directory: each key is a file under the root. Writes go to a
// hidden file beside the target that is fsynced and then renamed (Put) or linked (Create)
// into place, so that a crash never leaves a partial object under its key.
type Dir struct {
	root string
}

// NewDir returns the store rooted at root; directories are created as objects need them.
func NewDir(root string) *Dir { return &Dir{root: filepath.Clean(root)} }

func (d *Dir) path(key string) string { return filepath.Join(d.root, filepath.FromSlash(key)) }

// URL is the object's file path.
func (d *Dir) URL(key string) string { return d.path(key) }

func (d *Dir) Put(ctx context.Context, key string, data []byte) error {
	return d.write(ctx, key, data, false)
}

func (d *Dir) Create(ctx context.Context, key string, data []byte) error {
	return d.write(ctx, key, data, true)
}

func (d *Dir) write(ctx context.Context, key string, data []byte, exclusive bool) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("write %s: %w", d.URL(key), err)
	}
	target := d.path(key)
	dir := filepath.Dir(target)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("write %s: %w", d.URL(key), err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(target)+tmpMark+"*")
	if err != nil {
		return fmt.Errorf("write %s: %w", d.URL(key), err)
	}
	defer os.Remove(tmp.Name()) // after the rename or link, a no-op or the spare name
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", d.URL(key), err)
	}
	if exclusive {
		// link(2) fails on an existing name, atomically: two racing Creates cannot both win.
		err = os.Link(tmp.Name(), target)
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("write %s: %w", d.URL(key), ErrExists)
		}
	} else {
		err = os.Rename(tmp.Name(), target)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", d.URL(key), err)
	}
	return durable.SyncDir(dir)
}

func (d *Dir) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if _, err := d.Stat(ctx, key); err != nil {
		return nil, err
	}
	f, err := os.Open(d.path(key))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", d.URL(key), ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", d.URL(key), err)
	}
	return f, nil
}

func (d *Dir) Stat(_ context.Context, key string) (int64, error) {
	if err := checkKey(key); err != nil {
		return 0, err
	}
	fi, err := os.Lstat(d.path(key))
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) || (err == nil && !fi.Mode().IsRegular()) {
		return 0, fmt.Errorf("%s: %w", d.URL(key), ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("stat %s: %w", d.URL(key), err)
	}
	return fi.Size(), nil
}

func (d *Dir) List(_ context.Context, dir string) ([]Entry, error) {
	if err := checkDir(dir); err != nil {
		return nil, err
	}
	des, err := os.ReadDir(d.path(dir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil // as in S3, a directory nothing was written under is empty
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", d.URL(dir), err)
	}
	var out []Entry
	for _, de := range des {
		name := de.Name()
		if strings.HasPrefix(name, ".") && strings.Contains(name, tmpMark) {
			continue
		}
		key := name
		if dir != "" {
			key = dir + "/" + name
		}
		switch {
		case de.IsDir():
			out = append(out, Entry{Key: key, Dir: true})
		case de.Type().IsRegular():
			fi, err := de.Info()
			if err != nil {
				continue // removed since ReadDir
			}
			out = append(out, Entry{Key: key, Size: fi.Size(), Modified: fi.ModTime()})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

func (d *Dir) Partial(_ context.Context, dir string) ([]Entry, error) {
	if err := checkDir(dir); err != nil {
		return nil, err
	}
	des, err := os.ReadDir(d.path(dir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", d.URL(dir), err)
	}
	var out []Entry
	for _, de := range des {
		if name := de.Name(); strings.HasPrefix(name, ".") && strings.Contains(name, tmpMark) && de.Type().IsRegular() {
			if fi, err := de.Info(); err == nil {
				out = append(out, Entry{Key: path.Join(dir, name), Size: fi.Size(), Modified: fi.ModTime()})
			}
		}
	}
	return out, nil
}

func (d *Dir) Delete(_ context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if err := os.Remove(d.path(key)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete %s: %w", d.URL(key), err)
	}
	return nil
}
