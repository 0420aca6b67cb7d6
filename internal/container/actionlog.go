package container

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/gpucr/gpucr/internal/proctree"
)

// The action script's log is rotated when it opens past LogMaxBytes, LogKept old files
// kept: the integration runs on every GPU checkpoint of the host for as long as it is
// installed.
const (
	LogMaxBytes = 1 << 20
	LogKept     = 3
)

// OpenLog opens the log at path for appending, first moving it to path.1 (path.1 to path.2,
// and so on, the oldest dropped) once it holds maxBytes or more.
func OpenLog(path string, maxBytes int64, kept int) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", filepath.Dir(path), err)
	}
	if fi, err := os.Stat(path); err == nil && fi.Size() >= maxBytes {
		// Renames only: a second gpucr rotating at the same moment loses nothing but a turn.
		for i := kept - 1; i >= 1; i-- {
			_ = os.Rename(path+"."+strconv.Itoa(i), path+"."+strconv.Itoa(i+1))
		}
		if kept > 0 {
			_ = os.Rename(path, path+".1")
		} else {
			_ = os.Remove(path)
		}
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open the action log: %w", err)
	}
	return f, nil
}

// TellEngine writes line on the standard error of the process that started CRIU (runc,
// crun, or a shell), where the person or engine that asked for the checkpoint reads first.
// The script's own standard error is CRIU's log, which runc and crun only name. Nothing is
// written where that standard error is CRIU's log too, and a closed or unreachable one is
// left alone: the failure is in CRIU's log either way.
func TellEngine(criuPID int, line string) {
	criu, err := proctree.Read(criuPID)
	if err != nil || criu.PPID <= 1 {
		return
	}
	engineErr := fmt.Sprintf("/proc/%d/fd/2", criu.PPID)
	if same(engineErr, "/proc/self/fd/2") {
		return
	}
	// O_APPEND: a regular file there is added to, never written over.
	f, err := os.OpenFile(engineErr, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return
	}
	defer f.Close()
	_, _ = f.WriteString(line + "\n")
}

// same says whether two paths name the same file.
func same(a, b string) bool {
	var sa, sb syscall.Stat_t
	return syscall.Stat(a, &sa) == nil && syscall.Stat(b, &sb) == nil && sa.Dev == sb.Dev && sa.Ino == sb.Ino
}
