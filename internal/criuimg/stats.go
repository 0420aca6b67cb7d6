package criuimg

import (
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/crit"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/stats"

	"github.com/gpucr/gpucr/internal/beneath"
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
func ReadDumpStats(workDir string) (*DumpStats, error) { return ReadDumpStatsFS(beneath.FS(workDir)) }

// ReadDumpStatsFS is ReadDumpStats of the stats-dump in fsys.
func ReadDumpStatsFS(fsys fs.FS) (*DumpStats, error) {
	e, err := readStats(fsys, crit.StatsDump)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	s := e.GetDump()
	return &DumpStats{
		Freezing: us(s.GetFreezingTime()), Frozen: us(s.GetFrozenTime()),
		MemDump: us(s.GetMemdumpTime()), MemWrite: us(s.GetMemwriteTime()),
		PagesScanned: s.GetPagesScanned(), PagesWritten: s.GetPagesWritten(),
	}, nil
}

// ReadRestoreStats reads CRIU's stats-restore in workDir; nil, nil if CRIU left none.
func ReadRestoreStats(workDir string) (*RestoreStats, error) {
	e, err := readStats(beneath.FS(workDir), crit.StatsRestore)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	s := e.GetRestore()
	return &RestoreStats{Forking: us(s.GetForkingTime()), Restore: us(s.GetRestoreTime()), PagesRestored: s.GetPagesRestored()}, nil
}

// readStats reads the stats file name in fsys. crit's own GetDumpStats and
// GetRestoreStats panic on a file that holds no entry, and the stats inspect reads are in
// an image's logs/, which no checksum covers.
func readStats(fsys fs.FS, name string) (*stats.StatsEntry, error) {
	entries, err := decode(newBudget(), fsys, name, &stats.StatsEntry{})
	if err != nil {
		return nil, err
	}
	if len(entries) == 0 {
		return nil, fmt.Errorf("read %s: no entries", name)
	}
	return entries[0], nil
}

// us converts CRIU's microseconds.
func us(v uint32) time.Duration { return time.Duration(v) * time.Microsecond }
