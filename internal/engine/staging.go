package engine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/rootonly"
	"github.com/gpucr/gpucr/internal/txn"
)

// StagingDir is a path made for an operation before the operation itself begins: a
// streamed restore's fetched files, a streamed checkpoint's small files, a pull's, fold's
// or import's image before it is renamed into place, an archive before it is linked. A
// record of its own names it before it exists, so that a gpucr killed at any point leaves
// it to recovery (the next operation's, or gpucr recover) rather than to nobody.
type StagingDir struct {
	Dir       string
	j         *txn.Journal
	discarded []string // directories Keep named, to remove after all
}

// TempDir is where root's gpucr makes its temporary directories ($TMPDIR, else /tmp), and
// only where others cannot swap what it writes there by name (a root-owned sticky one, as
// /tmp, may be open to them): a job's TMPDIR its user owns let the user rename root's
// directory and put a symlink in its place, and root's CRIU wrote its log through it over a
// root-only file (hostile test). A gpucr run by a user writes only with that user's rights.
func TempDir() (string, error) {
	dir := os.TempDir()
	if os.Geteuid() != 0 {
		return dir, nil
	}
	if err := rootonly.Walk(dir); err != nil {
		return "", fmt.Errorf("temporary directory %s: %w: others could swap what root writes there; set TMPDIR to a directory only root can change", dir, err)
	}
	return dir, nil
}

// NewStagingDir journals under root a directory for what (as people read it: "restore
// --from URL") in the system's temporary directory, named prefix and the record's ID, and
// then makes it. Without a journal (root "") it is only made.
func NewStagingDir(root, what, prefix string) (*StagingDir, error) {
	tmp, err := TempDir()
	if err != nil {
		return nil, fmt.Errorf("staging for %s: %w", what, err)
	}
	if root == "" {
		dir, err := os.MkdirTemp(tmp, prefix+"*")
		if err != nil {
			return nil, fmt.Errorf("staging for %s: %w", what, err)
		}
		return &StagingDir{Dir: dir}, nil
	}
	if os.Geteuid() != 0 {
		return nil, ErrNotRoot
	}
	s, err := newStagingPath(root, what, func(id string) string { return filepath.Join(tmp, prefix+id) })
	if err != nil {
		return nil, err
	}
	if err := os.Mkdir(s.Dir, 0o700); err != nil {
		return nil, errors.Join(fmt.Errorf("staging for %s: %w", what, err), s.j.End())
	}
	return s, nil
}

// NewStagingBeside journals under root, for what, the staging of dst: the path beside it
// (image.StagingPath, named by the record) that the caller then makes itself and renames or
// links to dst. Without a journal (root "", or a caller other than root, who cannot write
// it) Dir is "", and the caller picks a name of its own.
func NewStagingBeside(root, what, dst string) (*StagingDir, error) {
	return newStagingPath(root, what, func(id string) string { return image.StagingPath(dst, id) })
}

// newStagingPath journals under root the path name(ID of the record) for what.
func newStagingPath(root, what string, name func(id string) string) (*StagingDir, error) {
	if root == "" || os.Geteuid() != 0 {
		return &StagingDir{}, nil
	}
	// What killed stagings left goes first; what cannot go now waits for gpucr recover.
	_, _ = RecoverStaleStaging(root)
	j, err := txn.Begin(root, txn.OpStaging, what)
	if err != nil {
		return nil, err
	}
	s := &StagingDir{Dir: name(j.ID()), j: j}
	if err := checkNameFits(s.Dir); err != nil {
		return nil, errors.Join(fmt.Errorf("staging for %s: %w", what, err), j.End())
	}
	if err := j.Update(func(r *txn.Record) { r.Paths = []string{s.Dir} }); err != nil {
		return nil, errors.Join(err, j.End())
	}
	return s, nil
}

// maxName is the longest name a directory entry may have on Linux's file systems (NAME_MAX).
const maxName = 255

// checkNameFits refuses a staging path whose last name is longer than a file system takes:
// one made from a destination's name with a prefix and the record's ID can be. An export
// to a 240-character name was refused only once its container had been checkpointed and
// removed, and the journaled path, which could be neither made nor removed, failed every
// gpucr recover after (hostile test).
func checkNameFits(path string) error {
	if n := len(filepath.Base(path)); n > maxName {
		return fmt.Errorf("%w: its staging name beside the destination would be %d bytes, more than the %d a file name may have: give a shorter name",
			ErrNameTooLong, n, maxName)
	}
	return nil
}

// ID is the staging's record ID, "" when it is not journaled.
func (s *StagingDir) ID() string {
	if s.j == nil {
		return ""
	}
	return s.j.ID()
}

// Keep journals dir, which the caller makes next, as the image directory the operation
// commits a checkpoint into (an export's, packed from there into its archive): a rollback
// removes it only while it is empty, and names it once it holds the only copy of a job.
func (s *StagingDir) Keep(dir string) error {
	if s.j == nil {
		return nil
	}
	return s.j.Update(func(r *txn.Record) { r.Image = dir })
}

// Discard journals dir, which Keep named, as one to remove after all (its image is packed
// whole elsewhere), and Close then removes it: a gpucr killed while it goes leaves recovery
// to remove it whole, not to keep what is left of it as a checkpoint.
func (s *StagingDir) Discard(dir string) error {
	s.discarded = append(s.discarded, dir)
	if s.j == nil {
		return nil
	}
	return s.j.Update(func(r *txn.Record) { r.Image, r.Paths = "", append(r.Paths, dir) })
}

// Close removes the staged path and what Discard named, then the record; a directory Keep
// named is left alone. A path that could not be removed keeps its record, for recovery to
// retry.
func (s *StagingDir) Close() error {
	for _, p := range append([]string{s.Dir}, s.discarded...) {
		if p == "" {
			continue
		}
		if err := removeAll(p); err != nil {
			return fmt.Errorf("remove %s: %w", p, err)
		}
	}
	if s.j == nil {
		return nil
	}
	return s.j.End()
}
