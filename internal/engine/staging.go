package engine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gpucr/gpucr/internal/txn"
)

// StagingDir is a directory made for an operation before the operation itself begins: a
// streamed restore's fetched files, a streamed checkpoint's small files. A record of its
// own names it before it exists, so that a gpucr killed at any point leaves it to recovery
// (the next operation's, or gpucr recover) rather than to nobody.
type StagingDir struct {
	Dir string
	j   *txn.Journal
}

// NewStagingDir journals under root a directory for what (as people read it: "restore
// --from URL") in the system's temporary directory, named prefix and the record's ID, and
// then makes it. Without a journal (root "") it is only made.
func NewStagingDir(root, what, prefix string) (*StagingDir, error) {
	if root == "" {
		dir, err := os.MkdirTemp("", prefix+"*")
		if err != nil {
			return nil, fmt.Errorf("staging for %s: %w", what, err)
		}
		return &StagingDir{Dir: dir}, nil
	}
	if os.Geteuid() != 0 {
		return nil, ErrNotRoot
	}
	j, err := txn.Begin(root, txn.OpStaging, what)
	if err != nil {
		return nil, err
	}
	s := &StagingDir{Dir: filepath.Join(os.TempDir(), prefix+j.ID()), j: j}
	if err := j.Update(func(r *txn.Record) { r.Paths = []string{s.Dir} }); err != nil {
		return nil, errors.Join(err, j.End())
	}
	if err := os.Mkdir(s.Dir, 0o700); err != nil {
		return nil, errors.Join(fmt.Errorf("staging for %s: %w", what, err), j.End())
	}
	return s, nil
}

// Close removes the directory, then its record. A directory that could not be removed
// keeps its record, for recovery to retry.
func (s *StagingDir) Close() error {
	if err := removeAll(s.Dir); err != nil {
		return fmt.Errorf("remove %s: %w", s.Dir, err)
	}
	if s.j == nil {
		return nil
	}
	return s.j.End()
}
