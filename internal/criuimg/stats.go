package criuimg

import (
	"errors"
	"io/fs"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/crit"
)

// DumpStats is what CRIU measured of one dump (its stats-dump file): where a dump's time
// went inside CRIU.
type DumpStats struct {
	Freezing time.Duration `json:"freezingNs"` // stopping the tree
	Frozen   time.Duration `json:"frozenNs"`   // the tree stopped, in all
	MemDump  time.Duration `json:"memdumpNs"`  // draining the pages out of the processes
	MemWrite time.Duration `json:"memwriteNs"` // writing them out (or sending them to a page server)
	// Pages scanned in the processes' mappings, and written into the image.
	PagesScanned uint64 `json:"pagesScanned"`
	PagesWritten uint64 `json:"pagesWritten"`
}

// RestoreStats is what CRIU measured of one restore (its stats-restore file).
type RestoreStats struct {
	Forking       time.Duration `json:"forkingNs"` // re-creating the process tree
	Restore       time.Duration `json:"restoreNs"` // everything else, memory included
	PagesRestored uint64        `json:"pagesRestored"`
}

// ReadDumpStats reads CRIU's stats-dump in workDir; nil, nil if CRIU left none.
func ReadDumpStats(workDir string) (*DumpStats, error) {
	s, err := crit.GetDumpStats(workDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &DumpStats{
		Freezing: us(s.GetFreezingTime()), Frozen: us(s.GetFrozenTime()),
		MemDump: us(s.GetMemdumpTime()), MemWrite: us(s.GetMemwriteTime()),
		PagesScanned: s.GetPagesScanned(), PagesWritten: s.GetPagesWritten(),
	}, nil
}

// ReadRestoreStats reads CRIU's stats-restore in workDir; nil, nil if CRIU left none.
func ReadRestoreStats(workDir string) (*RestoreStats, error) {
	s, err := crit.GetRestoreStats(workDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &RestoreStats{Forking: us(s.GetForkingTime()), Restore: us(s.GetRestoreTime()), PagesRestored: s.GetPagesRestored()}, nil
}

// us converts CRIU's microseconds.
func us(v uint32) time.Duration { return time.Duration(v) * time.Microsecond }
