package image

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/internal/crashpoint"
	"github.com/gpucr/gpucr/internal/durable"
	"github.com/gpucr/gpucr/internal/rootonly"
	"github.com/gpucr/gpucr/internal/signing"
)

// Errors Begin and Commit refuse an image directory for.
var (
	// ErrNotEmpty means the image directory already holds something: gpucr never overwrites.
	ErrNotEmpty = errors.New("image directory is not empty")
	// ErrParentMissing means the parent of an image directory, or of a local store
	// location, does not exist; gpucr does not create it, so a mistyped path fails instead
	// of scattering directories (ParentExists).
	ErrParentMissing = errors.New("parent directory does not exist")
	// ErrNotAPlace means the image directory is a symlink or a mount point: the finished
	// image is renamed into place, which neither can take, so the checkpoint would pause
	// the workload for an image it could never keep.
	ErrNotAPlace = errors.New("image directory cannot take an image")
)

// partialMark is in the name of every staging directory, which Load refuses by name: a
// crash between writing the manifest and the rename leaves one that has a manifest.
const partialMark = ".partial-"

// Staging is an image being written. It lives in a hidden directory beside its final
// place, on the same filesystem, and becomes the image only by Commit's rename, so a
// crash at any point leaves no image at the final path.
type Staging struct {
	dir, final string
	committed  bool
	// SignWith, when set, signs the manifest as it is sealed.
	SignWith ed25519.PrivateKey

	// Page files written through CreatePages, checksummed as they were written.
	mu         sync.Mutex
	pagesFiles []*PagesFile
	poolOnce   sync.Once
	pages      *pagesPool
}

// Begin checks that final can receive an image and creates its staging directory. The
// staging directory is created here, not at Commit, so that an unwritable place fails
// before the process tree is frozen.
func Begin(final string) (*Staging, error) { return BeginAt(final, "") }

// StagingPath is where an image for final is staged under the name tag (a journal's
// record ID), so that the path can be journaled before the directory exists.
func StagingPath(final, tag string) string {
	final = filepath.Clean(final)
	if tag == "" {
		return ""
	}
	return filepath.Join(filepath.Dir(final), "."+filepath.Base(final)+partialMark+tag)
}

// CommittedFrom says whether the image staged at staging (a StagingPath) was committed:
// the staging directory is gone and its final directory holds an image. A gpucr killed
// between the commit's rename and its journal's word of it leaves exactly that.
func CommittedFrom(staging string) (final string, ok bool) {
	base := filepath.Base(staging)
	i := strings.Index(base, partialMark)
	if !strings.HasPrefix(base, ".") || i < 2 {
		return "", false
	}
	final = filepath.Join(filepath.Dir(staging), base[1:i])
	if _, err := os.Lstat(staging); !errors.Is(err, fs.ErrNotExist) {
		return "", false
	}
	if _, err := Load(final); err != nil {
		return "", false
	}
	return final, true
}

// BeginAt is Begin with the staging directory at staging (from StagingPath), or at a
// fresh random name when staging is "".
func BeginAt(final, staging string) (*Staging, error) {
	final = filepath.Clean(final)
	parent, base := filepath.Dir(final), filepath.Base(final)
	if err := ParentExists("image directory", final); err != nil {
		return nil, err
	}
	if err := checkFinal(final); err != nil {
		return nil, err
	}
	if err := CheckParent(final); err != nil {
		return nil, err
	}
	// 0700: the image holds the process's memory, secrets included.
	var dir string
	var err error
	if staging == "" {
		dir, err = os.MkdirTemp(parent, "."+base+partialMark+"*")
	} else {
		dir, err = staging, os.Mkdir(staging, 0o700)
	}
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

// ParentExists refuses a place gpucr is to create (what names it: "image directory")
// whose parent directory is missing or no directory: gpucr makes the place itself, never
// its parents, so that a mistyped path or an unmounted file system fails instead of
// putting the data on another disk.
func ParentExists(what, final string) error {
	final = filepath.Clean(final)
	parent := filepath.Dir(final)
	switch fi, err := os.Stat(parent); {
	case errors.Is(err, fs.ErrNotExist):
		return sentinelf(ErrParentMissing, "parent directory %s of %s %s does not exist: create it (or mount its file system) first, or correct the path", parent, what, final)
	case err != nil:
		return fmt.Errorf("%s %s: %w", what, final, err)
	case !fi.IsDir():
		return fmt.Errorf("%s %s: parent %s is not a directory", what, final, parent)
	}
	return nil
}

// CheckParent refuses, to gpucr running as root, a place for a new image in a directory
// that others can change (a root-owned sticky one, as /tmp, excepted), or below one: root
// writes the process's memory and CRIU's files there by name, and a user who can rename
// what that directory holds had root truncate a file of the user's choosing and read the
// dumped memory (a hostile test). A gpucr run by a user writes only with that user's rights.
func CheckParent(final string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	parent := filepath.Dir(filepath.Clean(final))
	if err := rootonly.Walk(parent); err != nil {
		return fmt.Errorf("image directory %s: %w: others could swap what root writes there; make images in a directory only root can change", final, err)
	}
	return nil
}

// CheckFinal refuses a place for a new image that is neither absent nor an empty directory,
// as Begin does: for images that arrive otherwise than by a checkpoint (an imported archive).
func CheckFinal(final string) error { return checkFinal(filepath.Clean(final)) }

// Holding returns the image directory at path or above it, if there is one: a new image,
// or a store, put inside an image adds files its manifest does not list, and the image no
// longer verifies (hostile test: fold, checkpoint -D and pull into an image all said they
// succeeded, and broke it). An image is a directory with a manifest and its seal.
func Holding(path string) (string, bool) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", false
	}
	for dir := abs; ; dir = filepath.Dir(dir) {
		if isRegular(filepath.Join(dir, ManifestName)) && isRegular(filepath.Join(dir, SealName)) {
			return dir, true
		}
		if dir == filepath.Dir(dir) {
			return "", false
		}
	}
}

func isRegular(path string) bool {
	fi, err := os.Lstat(path)
	return err == nil && fi.Mode().IsRegular()
}

// checkFinal accepts a final path that is absent or an empty directory, not a symlink or
// a mount point, nor inside an image.
func checkFinal(final string) error {
	if img, ok := Holding(filepath.Dir(final)); ok {
		return sentinelf(ErrNotAPlace, "image directory %s is inside the image %s, which it would change: give a path outside it", final, img)
	}
	fi, err := os.Lstat(final)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("image directory %s: %w", final, err)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		to, _ := os.Readlink(final)
		return sentinelf(ErrNotAPlace, "image directory %s is a symlink (to %s): give a path that is not one", final, to)
	}
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, final, unix.AT_SYMLINK_NOFOLLOW, 0, &stx); err == nil &&
		stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 && stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0 {
		return sentinelf(ErrNotAPlace, "image directory %s is a mount point: give a new directory inside it", final)
	}
	if !fi.IsDir() {
		return fmt.Errorf("image directory %s exists and is not a directory", final)
	}
	f, err := os.Open(final)
	if err != nil {
		return fmt.Errorf("image directory %s: %w", final, err)
	}
	defer f.Close()
	// One name is enough to know; a huge directory is not listed.
	if _, err := f.Readdirnames(1); err == nil {
		return notEmpty(final)
	} else if err != io.EOF {
		return fmt.Errorf("read image directory %s: %w", final, err)
	}
	return nil
}

// notEmpty refuses final for holding something, saying what to do: the bare "is not empty"
// left a user to guess whether gpucr wanted it emptied or a new path (documentation walk).
func notEmpty(final string) error {
	return sentinelf(ErrNotEmpty, "image directory %s is not empty: give a new or empty directory (gpucr never writes over what is there)", final)
}

// Dir is the staging directory.
func (s *Staging) Dir() string { return s.dir }

// CRIUDir is where CRIU writes its image files.
func (s *Staging) CRIUDir() string { return filepath.Join(s.dir, CRIUDir) }

// LogsDir is where CRIU writes its logs, kept with the image for diagnosis.
func (s *Staging) LogsDir() string { return filepath.Join(s.dir, LogsDir) }

// Commit checksums every staged file into m, writes the manifest, makes everything durable
// and renames the staging directory into place: the rename is the commit point, so the
// image appears whole or not at all.
func (s *Staging) Commit(m *Manifest) error { return s.CommitWith(m, nil) }

// CommitWith commits like Commit, taking the checksums of the staged files in known as
// given (computed as they were written) instead of reading the files again.
func (s *Staging) CommitWith(m *Manifest, known []File) error {
	if err := s.Seal(m, known); err != nil {
		return err
	}
	crashpoint.Hit("in commit")
	// rename(2) itself, not os.Rename: it atomically replaces an empty directory at final
	// and fails on a non-empty one, with no window in which final is missing or overwritten.
	if err := syscall.Rename(s.dir, s.final); err != nil {
		if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
			return notEmpty(s.final)
		}
		return fmt.Errorf("commit image to %s: rename %s: %w", s.final, s.dir, err)
	}
	s.committed = true
	if err := durable.SyncDir(filepath.Dir(s.final)); err != nil {
		return fmt.Errorf("image %s committed but not durable: %w", s.final, err)
	}
	return nil
}

// Seal checksums every staged file into m, adds the files of external (checksummed as they
// were written: here, or not here at all, like memory pages streamed to a store), and writes the
// manifest and its seal, all durably, without committing. Commit uses it; a streamed
// checkpoint uploads the sealed directory instead, so that its image exists only in the store.
func (s *Staging) Seal(m *Manifest, external []File) error {
	paths, dirs, err := stagedTree(s.dir)
	if err != nil {
		return err
	}
	written, err := s.writtenFiles()
	if err != nil {
		return err
	}
	// Page files written through CreatePages, and the external files, were checksummed (and
	// synced) as they were written: only the rest is read.
	known := slices.Concat(written, external)
	paths = slices.DeleteFunc(paths, func(p string) bool {
		return slices.ContainsFunc(known, func(f File) bool { return f.Path == p })
	})
	signed := s.SignWith != nil
	if signed {
		if known, err = s.addSHA256(known); err != nil {
			return err
		}
	}
	// Not yet cancellable: the engine passes no context here until issue 14's rewrite of it.
	files, err := sumFiles(context.Background(), s.dir, paths, true, func(int) bool { return signed })
	if err != nil {
		return err
	}
	files = append(files, known...)
	slices.SortFunc(files, func(a, b File) int { return strings.Compare(a.Path, b.Path) })
	m.FormatVersion = FormatVersion
	m.Files = files
	b, err := encode(m)
	if err != nil {
		return err
	}
	if err := writeSynced(filepath.Join(s.dir, ManifestName), b); err != nil {
		return err
	}
	if err := writeSynced(filepath.Join(s.dir, SealName), []byte(seal(b)+"\n")); err != nil {
		return err
	}
	if s.SignWith != nil {
		if err := writeSynced(filepath.Join(s.dir, SigName), signing.Sign(s.SignWith, b)); err != nil {
			return err
		}
	}
	for _, d := range dirs {
		if err := durable.SyncDir(d); err != nil {
			return err
		}
	}
	return nil
}

// addSHA256 gives the files checksummed as they were written their SHA-256, for a signed
// image: each is read again from the staging directory, its xxh64 checked on the way, but
// a file streamed to a store (never here) must come with its own.
func (s *Staging) addSHA256(known []File) ([]File, error) {
	var again []string
	for _, f := range known {
		if !f.Strong() {
			again = append(again, f.Path)
		}
	}
	got, err := sumFiles(context.Background(), s.dir, again, false, func(int) bool { return true })
	if err != nil {
		return nil, fmt.Errorf("SHA-256 of the files to sign: %w", err)
	}
	out := slices.Clone(known)
	for _, g := range got {
		i := slices.IndexFunc(out, func(f File) bool { return f.Path == g.Path })
		if out[i].XXH64 != g.XXH64 || out[i].Size != g.Size {
			return nil, &CorruptError{g.Path, "changed between its write and the image's seal"}
		}
		out[i] = g
	}
	return out, nil
}

// Abort removes the staging directory. It is safe to defer: it does nothing after Commit
// and again after itself.
func (s *Staging) Abort() error {
	if s.committed {
		return nil
	}
	s.mu.Lock()
	open := s.pagesFiles
	s.mu.Unlock()
	for _, p := range open {
		p.Close() // the image is being thrown away: only the workers must stop
	}
	s.stopPool()
	if err := os.RemoveAll(s.dir); err != nil {
		return fmt.Errorf("remove partial image %s: %w", s.dir, err)
	}
	return nil
}

// stagedTree lists the regular files under dir as sorted slash paths, the manifest and the
// logs excluded, and every directory, dir included. Anything else is refused: restore could
// not trust it. Logs are not checksummed: CRIU goes on writing them after the commit, and
// restore does not read them. It makes every file 0600 and every directory 0700.
func stagedTree(dir string) (files, dirs []string, err error) {
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		// An image holds a process's memory, deleted files and pipe data: only root reads
		// it, whichever writer (CRIU included) created a file and with what mode.
		switch {
		case d.IsDir():
			dirs = append(dirs, p)
			return os.Chmod(p, 0o700)
		case !d.Type().IsRegular():
			return fmt.Errorf("%s is not a regular file", filepath.ToSlash(rel))
		case rel != ManifestName && rel != SealName && rel != SigName && filepath.Dir(rel) != LogsDir:
			files = append(files, filepath.ToSlash(rel))
		}
		return os.Chmod(p, 0o600)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("list image files in %s: %w", dir, err)
	}
	slices.Sort(files)
	return files, dirs, nil
}

// encode is a manifest's bytes as an image holds them.
func encode(m *Manifest) ([]byte, error) {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode manifest: %w", err)
	}
	return append(b, '\n'), nil
}

// writeSynced writes b to a new or emptied file at path and syncs it; the errors of package
// os name the path and the step.
func writeSynced(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
