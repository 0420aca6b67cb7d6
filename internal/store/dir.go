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

	"github.com/gpucr/gpucr/internal/beneath"
	"github.com/gpucr/gpucr/internal/rootonly"
)

// tmpMark is in the name of every file Dir is still writing; List hides them, so an
// interrupted write is never seen as an object.
const tmpMark = ".tmp-"

// Dir is a store in a local directory: each key is a file under the root. Writes go to a
// hidden file beside the target that is fsynced and then renamed (Put) or linked (Create)
// into place, so that a crash never leaves a partial object under its key. Every path is
// resolved without following a symlink, and only regular files are objects: a store others
// can write must not send gpucr, as root, to read, write or delete anything outside it.
type Dir struct {
	root string
}

// NewDir returns the store rooted at root; directories are created as objects need them.
func NewDir(root string) *Dir { return &Dir{root: filepath.Clean(root)} }

func (d *Dir) path(key string) string { return filepath.Join(d.root, filepath.FromSlash(key)) }

// URL is the object's file path.
func (d *Dir) URL(key string) string { return d.path(key) }

// held opens the directory that holds key's file, and returns the file's name in it. A
// missing directory is ErrNotFound; with create it is made instead.
func (d *Dir) held(key string, create bool) (*beneath.Dir, string, error) {
	dir, name := filepath.Split(d.path(key))
	open := beneath.OpenDir
	if create {
		open = func(p string) (*beneath.Dir, error) { return beneath.OpenDirAll(p, 0o700) }
	}
	hd, err := open(dir)
	if !create && (errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)) {
		return nil, "", fmt.Errorf("%s: %w", d.URL(key), ErrNotFound)
	}
	if err != nil {
		return nil, "", err // it names the directory
	}
	return hd, name, nil
}

// OthersCanWrite says whether a user other than this process's, or root, could add or swap
// files under dir: dir (or, where it is not made yet, the directory that would hold it) is
// writable by its group or others, or another user's, or a directory above it is, but for a
// sticky one of root's or ours, where others cannot rename what is not theirs.
func (d *Dir) OthersCanWrite(dir string) bool {
	me := uint32(os.Geteuid())
	leaf := true
	for p := d.path(dir); ; p = filepath.Dir(p) {
		fi, err := os.Lstat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return true
		default:
			st, ok := fi.Sys().(*syscall.Stat_t)
			ours := ok && (st.Uid == me || st.Uid == 0)
			sticky := fi.Mode()&os.ModeSticky != 0 && !leaf
			if !ours || (fi.Mode().Perm()&0o022 != 0 && !sticky) {
				return true
			}
			leaf = false
		}
		if p == filepath.Dir(p) {
			return false
		}
	}
}

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
	hd, name, err := d.held(key, true)
	if err != nil {
		return fmt.Errorf("write %s: %w", d.URL(key), err)
	}
	defer hd.Close()
	tmp, tmpName, err := hd.CreateTemp("." + name + tmpMark)
	if err != nil {
		return fmt.Errorf("write %s: %w", d.URL(key), err)
	}
	defer func() { _ = hd.Remove(tmpName) }() // after the rename or link, a no-op or the spare name
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
		err = hd.Link(tmpName, name)
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("write %s: %w", d.URL(key), ErrExists)
		}
	} else {
		err = hd.Rename(tmpName, name)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", d.URL(key), err)
	}
	return hd.Sync()
}

// Get opens the object without following a symlink and without blocking: a symlink, a FIFO
// or anything else that is no regular file is no object.
func (d *Dir) Get(_ context.Context, key string) (io.ReadCloser, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	hd, name, err := d.held(key, false)
	if err != nil {
		return nil, err
	}
	defer hd.Close()
	f, err := hd.Open(name)
	if missing(err) {
		return nil, fmt.Errorf("%s: %w", d.URL(key), ErrNotFound)
	}
	if notRegular(err) {
		return nil, fmt.Errorf("%s: %w", d.URL(key), ErrNotObject)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", d.URL(key), err)
	}
	return f, nil
}

// missing says whether err means that a name is not there; notRegular, that it is there
// but no regular file (a symlink, refused by O_NOFOLLOW, included).
func missing(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)
}

func notRegular(err error) bool {
	return errors.Is(err, beneath.ErrNotRegular) || errors.Is(err, syscall.ELOOP)
}

func (d *Dir) Stat(_ context.Context, key string) (int64, error) {
	if err := checkKey(key); err != nil {
		return 0, err
	}
	hd, name, err := d.held(key, false)
	if err != nil {
		return 0, err
	}
	defer hd.Close()
	fi, err := hd.Lstat(name)
	if missing(err) {
		return 0, fmt.Errorf("%s: %w", d.URL(key), ErrNotFound)
	}
	if notRegular(err) || (err == nil && !fi.Mode().IsRegular()) {
		return 0, fmt.Errorf("%s: %w", d.URL(key), ErrNotObject)
	}
	if err != nil {
		return 0, fmt.Errorf("stat %s: %w", d.URL(key), err)
	}
	return fi.Size(), nil
}

// entries lists the directory dir (a key prefix); a missing one is empty, as in S3.
func (d *Dir) entries(dir string) ([]os.FileInfo, error) {
	if err := checkDir(dir); err != nil {
		return nil, err
	}
	hd, err := beneath.OpenDir(d.path(dir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", d.URL(dir), err)
	}
	defer hd.Close()
	fis, err := hd.Entries()
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", d.URL(dir), err)
	}
	return fis, nil
}

func (d *Dir) List(_ context.Context, dir string) ([]Entry, error) {
	fis, err := d.entries(dir)
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, fi := range fis {
		name := fi.Name()
		// A write in progress is a file; a directory of that name (a checkpoint a user called
		// .nightly.tmp-1) is listed, or a collection would take its chunks for unreferenced.
		if strings.HasPrefix(name, ".") && strings.Contains(name, tmpMark) && !fi.IsDir() {
			continue
		}
		key := name
		if dir != "" {
			key = dir + "/" + name
		}
		switch {
		case fi.IsDir():
			out = append(out, Entry{Key: key, Dir: true})
		case fi.Mode().IsRegular():
			out = append(out, Entry{Key: key, Size: fi.Size(), Modified: fi.ModTime()})
		default:
			// Passed over, a checkpoint moved behind a symbolic link was no checkpoint to a
			// collection, which removed its chunks (hostile test).
			if fi.Mode()&fs.ModeSymlink != 0 {
				return nil, fmt.Errorf("list %s: %s is a symbolic link, which gpucr does not follow, so it cannot tell what a collection would keep: remove the link, and name a checkpoint by its own path", d.URL(dir), name)
			}
			return nil, fmt.Errorf("list %s: %s is %w: remove it, a store holds checkpoints and their chunks only", d.URL(dir), name, ErrNotObject)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// TrustListing fails, when gpucr runs as root, unless dir and every directory on the way to
// it are root's and writable by no one else: a user who may rename what dir holds could
// move root's checkpoint out of a collection's sight, or rename a chunk it still needs to
// one it does not (a hostile test had root's gc delete root's checkpoint's chunks in a
// store directory a user owned). A user's collection acts on what that user can change
// anyway.
func (d *Dir) TrustListing(dir string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	if err := checkDir(dir); err != nil {
		return err
	}
	p := d.path(dir)
	if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return rootonly.Walk(p)
}

// PartialOf returns the name of the object that name, a piece Partial lists, is a write
// of ("x" for ".x.tmp-123").
func PartialOf(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, ".")
	if !ok {
		return "", false
	}
	object, _, ok := strings.Cut(rest, tmpMark)
	return object, ok && object != ""
}

func (d *Dir) Partial(_ context.Context, dir string) ([]Entry, error) {
	fis, err := d.entries(dir)
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, fi := range fis {
		if name := fi.Name(); strings.HasPrefix(name, ".") && strings.Contains(name, tmpMark) && fi.Mode().IsRegular() {
			out = append(out, Entry{Key: path.Join(dir, name), Size: fi.Size(), Modified: fi.ModTime()})
		}
	}
	return out, nil
}

// Delete removes the object's name, through the directory that holds it: a symlink put in
// its place is removed itself, never what it points to. A deletion whose context ended
// removes nothing, as a request not sent: a collection bounds its deletions so (review).
func (d *Dir) Delete(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("delete %s: %w", d.URL(key), err)
	}
	hd, name, err := d.held(key, false)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete %s: %w", d.URL(key), err)
	}
	defer hd.Close()
	if err := hd.Remove(name); err != nil {
		return fmt.Errorf("delete %s: %w", d.URL(key), err)
	}
	return nil
}
