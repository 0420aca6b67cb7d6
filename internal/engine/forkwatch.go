package engine

import (
	"slices"
	"sync"
	"time"

	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/txn"
)

// ForkWatch records, by PID and start time, every process a restore's CRIU makes (or the
// runtime that runs CRIU: runc for a container), as they appear: CRIU kills them itself when
// it fails, but not when it is killed (the OOM killer, an admin), and before its
// post-restore notification gpucr has no other record of them. Left, they sat in CRIU's
// restorer for good, every signal blocked, holding the image's PIDs (crash test). By start
// time a process is this restore's and no one else's.
type ForkWatch struct {
	criu    txn.Proc // the watched CRIU (or runtime)
	through string   // the command of the watched process's children followed ("": all)
	stop    chan struct{}
	done    chan struct{}
	stopped sync.Once
	mu      sync.Mutex
	seen    []txn.Proc
}

// forkWatchEvery is how often the watch looks for CRIU's new processes; one it misses (made
// and left between two looks, or on a host too loaded for the watch to look) is found by the
// kill of CRIU's forks: by CRIU's program, or by the image's (treeImage.kill).
const forkWatchEvery = time.Millisecond

// WatchCRIUForks watches the CRIUs that runtime (runc) starts, and what they make, until
// Stop: not the rest of what runtime starts (the OCI hooks it runs during a restore, or what
// a wrapper in its place runs), which a failed restore must leave alone. A container made
// meanwhile by a wrapper around runc had its init killed by the failed restore (e2e test).
func WatchCRIUForks(runtime int) *ForkWatch { return watchForks(runtime, "criu") }

// watchForks watches what the process at criuPID makes: all of it, or, with through set,
// only what descends from its children whose command is through (and those).
func watchForks(criuPID int, through string) *ForkWatch {
	w := &ForkWatch{stop: make(chan struct{}), done: make(chan struct{}), through: through}
	w.criu, _ = txn.ProcOf(criuPID)
	go func() {
		defer close(w.done)
		t := time.NewTicker(forkWatchEvery)
		defer t.Stop()
		known := map[txn.Proc]bool{}
		for {
			w.look(criuPID, known)
			select {
			case <-w.stop:
				w.look(criuPID, known) // what was made since the last look
				return
			case <-t.C:
			}
		}
	}()
	return w
}

// look records the descendants of pid not seen before, by PID and start time: a PID freed
// during the restore and taken again names another process.
func (w *ForkWatch) look(pid int, known map[txn.Proc]bool) {
	queue := proctree.Children(pid)
	if w.through != "" {
		queue = slices.DeleteFunc(queue, func(c int) bool {
			p, err := proctree.Read(c)
			return err != nil || p.Command != w.through
		})
	}
	for len(queue) > 0 {
		p := queue[0]
		queue = append(queue[1:], proctree.Children(p)...)
		proc, err := txn.ProcOf(p)
		if err != nil || known[proc] {
			continue
		}
		known[proc] = true
		w.mu.Lock()
		w.seen = append(w.seen, proc)
		w.mu.Unlock()
	}
}

// Stop ends the watch (once the restored tree is known another way, or CRIU is done) and
// returns what it saw, parents before children. It may be called again.
func (w *ForkWatch) Stop() []txn.Proc {
	if w == nil {
		return nil
	}
	w.stopped.Do(func() { close(w.stop) })
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seen
}

// criuStart is when the watched CRIU started (0 if unknown): nothing it made started earlier.
func (w *ForkWatch) criuStart() uint64 {
	if w == nil {
		return 0
	}
	return w.criu.Start
}
