package chunked

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/store"
)

// LeasesDir is the directory, beside checkpoints, where the pushes writing to its chunks
// and the collection sweeping them announce themselves. A push may reuse any chunk it finds,
// so no chunk may be swept while a push runs; a store offers no lock, so each side writes
// its lease first and then looks for the other's: of two that start together, at least one
// sees the other (the store reads its own writes), and the collection is the one that yields.
const LeasesDir = ".gpucr-leases"

// Lease timing. A holder rewrites its lease every leaseRefresh; one not rewritten for
// leaseTTL, by the store's clock, belongs to a gpucr that died and is ignored.
var (
	leaseRefresh = 5 * time.Second
	leaseTTL     = 20 * time.Second
	// writerWait bounds how long a push waits for a collection to notice it and stop: a
	// live one does so within a batch, a dead one's lease is stale within leaseTTL.
	writerWait = 3 * leaseTTL
)

// leaseAhead is how far ahead of the reader's own lease another's may be dated and count:
// beyond it, its time was set by hand.
const leaseAhead = 10 * time.Minute

// Lease kinds, the first part of a lease's name.
const (
	kindWrite   = "write"
	kindCollect = "collect"
)

// ErrBusy means a collection found others working in the same store directory.
var ErrBusy = errors.New("store directory busy")

// lease is one announcement in a store directory, kept fresh until released.
type lease struct {
	st   store.Store
	dir  string
	key  string
	stop context.CancelFunc
	done chan struct{}
	mu   sync.Mutex // serializes rewrites of the lease object

	// held tracks whether the lease stayed live throughout: when its last write that
	// succeeded began, and whether one ever came too late (its own lock: a write can hang).
	held struct {
		sync.Mutex
		at     time.Time
		lapses int
	}
}

// leaseSafe is how long after a write of the lease began it surely still counts as live,
// whatever the store's latency: half its life.
func leaseSafe() time.Duration { return leaseTTL / 2 }

// holder is another gpucr's live lease, as its name tells: KIND-HOST-SCOPE-PID-START-NONCE,
// where SCOPE is the kernel's boot ID and the PID namespace's (BOOT.NS) and START the
// process's start time, which together name the gpucr for good: one that ran where this one
// runs and is gone left its lease when it died.
type holder struct {
	kind, host, scope string
	pid               int
	start             uint64
}

// dead reports whether h's gpucr ran on this host, in this boot and PID namespace, and is
// gone. Containers of one node share its boot ID but not their PIDs: a live push in another
// PID namespace named a PID that meant nothing here, and a collection swept the chunks it
// was reusing.
func (h holder) dead() bool {
	here := pidScope()
	return h.scope == here && !strings.Contains(here, "unknown") && h.host == hostField() && !proctree.Same(h.pid, h.start)
}

func (h holder) String() string {
	what := map[string]string{kindWrite: "a push", kindCollect: "a collection"}[h.kind]
	return fmt.Sprintf("%s by gpucr %d on %s", what, h.pid, h.host)
}

func leasesKey(dir string) string {
	if dir == "" {
		return LeasesDir
	}
	return dir + "/" + LeasesDir
}

// takeLease writes a lease of kind in dir and keeps it fresh until release.
func takeLease(ctx context.Context, st store.Store, dir, kind string) (*lease, error) {
	self, err := proctree.Read(os.Getpid())
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, 8)
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	name := fmt.Sprintf("%s-%s-%s-%d-%d-%s", kind, hostField(), pidScope(), self.PID, self.Start, hex.EncodeToString(nonce))
	l := &lease{st: st, dir: dir, key: leasesKey(dir) + "/" + name, done: make(chan struct{})}
	if err := l.refresh(ctx); err != nil {
		return nil, fmt.Errorf("announce the %s in %s: %w", kind, st.URL(leasesKey(dir)), err)
	}
	rctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	l.stop = stop
	go func() {
		defer close(l.done)
		t := time.NewTicker(leaseRefresh)
		defer t.Stop()
		for {
			select {
			case <-rctx.Done():
				return
			case <-t.C:
				_ = l.refresh(rctx) // a lease that goes stale only lets a collection run
			}
		}
	}()
	return l, nil
}

func (l *lease) refresh(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	began := time.Now()
	// Empty: only the store's time of the write counts, and an empty file takes no block,
	// so a collection still takes its lease on the full file system it is to clean.
	if err := l.st.Put(ctx, l.key, nil); err != nil {
		return err
	}
	l.held.Lock()
	defer l.held.Unlock()
	if !l.held.at.IsZero() && since(l.held.at) > leaseSafe() {
		l.held.lapses++
	}
	l.held.at = began
	return nil
}

// since is how long ago t was by both clocks, whichever says longer: the monotonic one
// stands still while the host is suspended (or, on some hypervisors, its VM paused), when
// the store's clock, which judges the lease, runs on (review).
func since(t time.Time) time.Duration {
	return max(time.Since(t), time.Now().Round(0).Sub(t.Round(0)))
}

// mark is a point in the lease's life for liveSince: the lapses so far.
func (l *lease) mark() int {
	l.held.Lock()
	defer l.held.Unlock()
	return l.held.lapses
}

// liveSince says whether the lease has surely been live since mark was taken, and until
// when it surely still is: no write of it came later than leaseSafe after the one before,
// nor is one overdue now. A write that hung, or a gpucr stopped for a while (SIGSTOP, a
// frozen cgroup, a paused VM), let a lease go stale, and another gpucr took its holder for
// dead: a collection swept chunks a live push had stored and then named in its manifest
// (review).
func (l *lease) liveSince(mark int) (bool, time.Time) {
	l.held.Lock()
	defer l.held.Unlock()
	left := leaseSafe() - since(l.held.at)
	return l.held.lapses == mark && left > 0, time.Now().Add(left)
}

// release stops refreshing the lease and deletes it, trying for leaseDropWait at most: a
// lease left is only stale in leaseTTL, and a store that stopped answering held a failed
// checkpoint --to, and the locks on its workload, for 3 more minutes of stalled tries
// (hostile test).
func (l *lease) release() {
	l.stop()
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), leaseDropWait)
	defer cancel()
	_ = l.st.Delete(ctx, l.key)
}

// leaseDropWait bounds the deletion of a lease given up.
var leaseDropWait = 5 * time.Second // a variable: tests shorten it

// others lists the live leases in the directory other than l. The store's clock decides
// what is live: a lease is compared with l's own, just rewritten.
func (l *lease) others(ctx context.Context) ([]holder, error) {
	if err := l.refresh(ctx); err != nil {
		return nil, err
	}
	entries, err := l.st.List(ctx, leasesKey(l.dir))
	if err != nil {
		return nil, err
	}
	var now time.Time
	for _, e := range entries {
		if e.Key == l.key {
			now = e.Modified
		}
	}
	if now.IsZero() {
		return nil, fmt.Errorf("%s: the lease just written is not listed", l.st.URL(l.key))
	}
	var out []holder
	for _, e := range entries {
		// A lease dated far ahead of the one just written was not written by a holder on
		// the store's clock: whoever can write the directory set its time, to keep it live.
		// A little ahead is a clock stepped back since (a local store's times are the
		// host's): a live push's lease dated 30 s ahead was skipped so, and a collection
		// removed the chunks it reused (review).
		if age := now.Sub(e.Modified); e.Dir || e.Key == l.key || age > leaseTTL || age < -leaseAhead {
			continue
		}
		if h, ok := parseHolder(path.Base(e.Key)); ok && !h.dead() {
			out = append(out, h)
		}
	}
	return out, nil
}

// parseHolder reads a lease name.
func parseHolder(name string) (holder, bool) {
	f := strings.Split(name, "-")
	if len(f) != 6 || (f[0] != kindWrite && f[0] != kindCollect) {
		return holder{}, false
	}
	pid, err1 := strconv.Atoi(f[3])
	start, err2 := strconv.ParseUint(f[4], 10, 64)
	return holder{kind: f[0], host: f[1], scope: f[2], pid: pid, start: start}, err1 == nil && err2 == nil
}

// leaseField makes s fit between a lease name's dashes.
func leaseField(s string) string {
	if s = strings.NewReplacer("-", "", "/", "_").Replace(s); s == "" {
		return "unknown"
	}
	return s
}

// pidScope names where this gpucr's PID means this process: this boot of this host (its
// boot ID) and this PID namespace (its inode), as BOOT.NS; "unknown" in it where the kernel
// does not say.
var pidScope = sync.OnceValue(func() string {
	b, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	ns := "unknown"
	if st, err := os.Stat("/proc/self/ns/pid"); err == nil {
		if sys, ok := st.Sys().(*syscall.Stat_t); ok {
			ns = strconv.FormatUint(sys.Ino, 10)
		}
	}
	return leaseField(strings.TrimSpace(string(b))) + "." + ns
})

// hostField is the host's name as a lease gives it.
var hostField = sync.OnceValue(func() string {
	host, _ := os.Hostname()
	return leaseField(host)
})

// writeLease announces a push in dir and returns once no collection runs there: a live
// one notices the push at its next batch and stops.
func writeLease(ctx context.Context, st store.Store, dir string, waiting func(string)) (*lease, error) {
	l, err := takeLease(ctx, st, dir, kindWrite)
	if err != nil {
		return nil, err
	}
	if err := l.awaitNoCollection(ctx, waiting); err != nil {
		l.release()
		return nil, err
	}
	return l, nil
}

// awaitNoCollection returns once no collection runs in l's directory: a live one notices l
// at its next batch and stops.
func (l *lease) awaitNoCollection(ctx context.Context, waiting func(string)) error {
	st, dir := l.st, l.dir
	deadline := time.Now().Add(writerWait)
	for {
		hs, err := l.others(ctx)
		if err != nil {
			return fmt.Errorf("look for a collection in %s: %w", st.URL(leasesKey(dir)), err)
		}
		var collecting []string
		for _, h := range hs {
			if h.kind == kindCollect {
				collecting = append(collecting, h.String())
			}
		}
		if len(collecting) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %s has not stopped for this push within %v", ErrBusy, strings.Join(collecting, ", "), writerWait)
		}
		if waiting != nil {
			waiting(fmt.Sprintf("%s in %s: waiting up to %v for it to stop", strings.Join(collecting, ", "), st.URL(dir), writerWait))
			waiting = nil
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
