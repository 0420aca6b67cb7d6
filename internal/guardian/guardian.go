// Package guardian keeps a process beside each gpucr operation that outlives gpucr: if gpucr
// dies before the operation ends, the guardian finishes its rollback from the journal.
package guardian

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/gpucr/gpucr/internal/txn"
)

// Descriptors the guardian finds open: the watch pipe, the journal's lock, then the target
// locks, which it holds so that nobody starts on the same process while it recovers.
const (
	WatchFD     = 3
	JournalFD   = 4
	FirstLockFD = 5
)

// dismissed is what gpucr writes before it closes the watch pipe on a normal end; EOF
// without it means gpucr died.
const dismissed = 'd'

// Guardian is a running guardian, seen from its gpucr.
type Guardian struct {
	cmd   *exec.Cmd
	watch *os.File
}

// Start runs argv in a session of its own, so that a kill of gpucr's process group or
// session does not reach it, handing it the journal's lock and the target locks.
func Start(argv []string, j *txn.Journal, locks []*txn.Lock) (*Guardian, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("start guardian: %w", err)
	}
	defer r.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.ExtraFiles = []*os.File{r, j.LockFile()}
	for _, l := range locks {
		cmd.ExtraFiles = append(cmd.ExtraFiles, l.File())
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, fmt.Errorf("start guardian %s: %w", argv[0], err)
	}
	return &Guardian{cmd: cmd, watch: w}, nil
}

// Dismiss tells the guardian the operation ended and waits for it to go.
func (g *Guardian) Dismiss() error {
	if g == nil {
		return nil
	}
	_, err := g.watch.Write([]byte{dismissed})
	g.watch.Close()
	done := make(chan error, 1)
	go func() { done <- g.cmd.Wait() }()
	select {
	case werr := <-done:
		return errors.Join(err, werr)
	case <-time.After(10 * time.Second):
		_ = g.cmd.Process.Kill()
		return errors.Join(err, <-done, errors.New("guardian did not leave when dismissed"))
	}
}

// Watch, in the guardian, blocks until its gpucr ends the operation (false) or dies (true).
func Watch(pipe io.Reader) (ownerDied bool) {
	var b [1]byte
	n, _ := pipe.Read(b[:])
	return n == 0 || b[0] != dismissed
}
