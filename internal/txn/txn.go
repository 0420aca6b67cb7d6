// Package txn is gpucr's journal of operations in flight: a record under /run/gpucr, written
// before an operation changes anything and removed when it commits or rolls back, that says
// what it changed, so that a gpucr that dies leaves behind what it takes to undo its work.
package txn

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/internal/durable"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/rootonly"
)

// DefaultRoot is where journals and locks live: tmpfs, so a reboot (which ends every
// operation) clears them, and root's alone.
const DefaultRoot = "/run/gpucr"

// Operations a record can describe.
const (
	OpCheckpoint = "checkpoint"
	OpRestore    = "restore"
	// OpStaging is a directory made before the operation that uses it begins (a streamed
	// restore's fetched files): its rollback is only the removal of its Paths.
	OpStaging = "staging"
)

// Record is what an operation has changed so far, and where it got to.
type Record struct {
	ID      string    `json:"id"`
	Op      string    `json:"op"`
	Target  string    `json:"target"` // for people: "PID 4242", "container web"
	Owner   Proc      `json:"owner"`  // the gpucr process doing it
	Started time.Time `json:"started"`
	Phase   string    `json:"phase"`
	// Tree is the processes the operation freezes (checkpoint) or creates (restore).
	Tree []Proc `json:"tree,omitempty"`
	// GPUs are the processes whose device state the operation locks, moves or restores.
	GPUs []GPUProc `json:"gpus,omitempty"`
	// Remap is the device mapping a restore resumes GPU processes with.
	Remap map[string]map[string]string `json:"remap,omitempty"`
	// THP is the host setting changed for the operation, with its old value.
	THP *Setting `json:"thp,omitempty"`
	// Paths are created by the operation and removed by its rollback (staging directories).
	Paths []string `json:"paths,omitempty"`
	// Container is the container a checkpoint pauses, and how to resume it.
	Container *Container `json:"container,omitempty"`
	// Image is a staging record's image directory, which a checkpoint commits into before
	// gpucr packs it elsewhere (an export's): never removed once it holds an image.
	Image string `json:"image,omitempty"`
	// Stored is where a streamed checkpoint is stored: its manifest, written there last in
	// its commit, makes it a checkpoint.
	Stored string `json:"stored,omitempty"`
	// Committed: a checkpoint's image is in place; a restore's tasks passed their checks
	// and were filled, so finishing beats killing them.
	Committed bool `json:"committed,omitempty"`
	// Locks name the target locks the operation holds (LockTarget).
	Locks []string `json:"locks,omitempty"`
}

// Proc names one process for good: a PID and its start time.
type Proc struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"`
}

// Alive reports whether p is still the process it was.
func (p Proc) Alive() bool { return proctree.Same(p.PID, p.Start) }

// ProcOf names a live process.
func ProcOf(pid int) (Proc, error) {
	p, err := proctree.Read(pid)
	if err != nil {
		return Proc{}, err
	}
	return Proc{PID: pid, Start: p.Start}, nil
}

// GPUProc is a process with device state of a backend.
type GPUProc struct {
	Backend string `json:"backend"`
	Proc
}

// Setting is a host setting and the value to put back.
type Setting struct {
	Path string `json:"path"`
	Old  string `json:"old"`
}

// Container is a paused container and the runtime command that resumes it.
type Container struct {
	ID      string   `json:"id"`
	Runtime []string `json:"runtime"` // e.g. ["runc", "--root", "/run/runc"]
	Paused  bool     `json:"paused"`
	// StateDir is the runtime's own directory for a container a restore creates: a runtime
	// killed halfway leaves it behind, with CRIU's root still mounted in it.
	StateDir string `json:"stateDir,omitempty"`
	// Bundle and Since are the bundle a restore's runtime was given and when it was started:
	// a container under the ID made earlier, or from another bundle, is not the restore's.
	Bundle string    `json:"bundle,omitempty"`
	Since  time.Time `json:"since,omitzero"`
}

// ErrBusy means another gpucr operation works on the same process or container.
var ErrBusy = errors.New("another gpucr operation is in progress")

// ErrUntrusted is a journal that users other than root could write, run by root: its
// records name commands to run, files to write and paths to remove, which root would do
// on a planted record's word (hostile test).
var ErrUntrusted = errors.New("the run directory is not root's alone")

// trusted fails, when gpucr runs as root, unless only root can change what the journal at
// root holds: its txn and locks directories are root's and writable by no one else, and so
// is every directory on the way to them (a root-owned sticky one such as /tmp excepted).
// A journal not made yet holds nothing.
func trusted(root string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	for _, dir := range []string{txnDir(root), locksDir(root)} {
		if err := rootOnlyDir(dir); err != nil {
			return fmt.Errorf("%w: %v; gpucr acts on no record there: give --run-dir a directory only root can write", ErrUntrusted, err)
		}
	}
	return nil
}

// rootOnlyDir checks the way to dir (rootonly.Walk) and dir itself with no exception for a
// sticky one: in a root-owned sticky directory that all may write (/tmp as the run
// directory), anyone may still add a record or a lock of their own (review).
func rootOnlyDir(dir string) error {
	err := rootonly.Walk(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	return rootonly.Mode(dir, fi)
}

// Journal is one operation's record on disk, held by a lock that its owner (and the
// guardian it hands the lock to) keeps for as long as either lives.
type Journal struct {
	root string
	mu   sync.Mutex
	rec  Record
	lock *Lock
}

func txnDir(root string) string { return filepath.Join(root, "txn") }

func (j *Journal) path() string { return filepath.Join(txnDir(j.root), j.rec.ID+".json") }

// Begin writes a new record for op on target, owned by this process, and locks it.
func Begin(root, op, target string) (*Journal, error) {
	self, err := ProcOf(os.Getpid())
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	id := make([]byte, 6)
	if _, err := rand.Read(id); err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	rec := Record{ID: op + "-" + hex.EncodeToString(id), Op: op, Target: target, Owner: self,
		Started: time.Now().UTC(), Phase: "begin"}
	if err := os.MkdirAll(txnDir(root), 0o700); err != nil {
		return nil, fmt.Errorf("journal: create %s: %w", txnDir(root), err)
	}
	if err := trusted(root); err != nil {
		return nil, err
	}
	lock, err := acquire(filepath.Join(txnDir(root), rec.ID+".lock"), "")
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	j := &Journal{root: root, rec: rec, lock: lock}
	if err := j.write(); err != nil {
		lock.Release()
		return nil, err
	}
	return j, nil
}

// Record is a copy of the record as last written.
func (j *Journal) Record() Record {
	j.mu.Lock()
	defer j.mu.Unlock()
	return clone(j.rec)
}

// ID names the record.
func (j *Journal) ID() string { return j.rec.ID }

// LockFile is the open lock of the record, for a guardian to share.
func (j *Journal) LockFile() *os.File { return j.lock.f }

// Update changes the record and makes the change durable before returning: what it
// describes must be on disk before the change it describes is made.
func (j *Journal) Update(change func(*Record)) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	change(&j.rec)
	if err := absolute(&j.rec); err != nil {
		return err
	}
	return j.writeLocked()
}

// absolute makes the record's paths absolute: they are given relative to this process's
// working directory, and read by another process in another one (gpucr recover, a later
// verb, the guardian). Read there, a relative -D or --export named nothing or another image:
// a killed export's only copy of its container was left unnamed, and a killed checkpoint
// reported as complete with an unrelated image (review).
func absolute(r *Record) error {
	r.Paths = slices.Clone(r.Paths)
	for i, p := range r.Paths {
		if p == "" {
			continue
		}
		abs, err := filepath.Abs(p)
		if err != nil {
			return fmt.Errorf("journal: %w", err)
		}
		r.Paths[i] = abs
	}
	if r.Image != "" {
		abs, err := filepath.Abs(r.Image)
		if err != nil {
			return fmt.Errorf("journal: %w", err)
		}
		r.Image = abs
	}
	return nil
}

// Phase records where the operation has got to.
func (j *Journal) Phase(name string) error {
	return j.Update(func(r *Record) { r.Phase = name })
}

func (j *Journal) write() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.writeLocked()
}

func (j *Journal) writeLocked() error {
	b, err := json.MarshalIndent(j.rec, "", "  ")
	if err != nil {
		return fmt.Errorf("journal: encode: %w", err)
	}
	tmp := j.path() + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	_, werr := f.Write(append(b, '\n'))
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp, j.path())
	}
	if werr != nil {
		os.Remove(tmp)
		return fmt.Errorf("journal: write %s: %w", j.path(), werr)
	}
	if err := durable.SyncDir(txnDir(j.root)); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	return nil
}

// End removes the record: the operation committed or was rolled back.
func (j *Journal) End() error {
	err := os.Remove(j.path())
	if errors.Is(err, fs.ErrNotExist) {
		err = nil
	}
	if serr := durable.SyncDir(txnDir(j.root)); err == nil && serr != nil {
		err = serr
	}
	j.lock.Release()
	if err != nil {
		return fmt.Errorf("journal: remove %s: %w", j.path(), err)
	}
	return nil
}

// Sweep removes what a gpucr killed while it wrote a record leaves beside the records: a
// record written aside (ID.json.tmp) and, where no record was ever written, the record's
// lock. Each is removed under the record's lock, which only a dead owner has let go of,
// so a gpucr just beginning that record keeps it.
func Sweep(root string) error {
	if err := trusted(root); err != nil {
		return err
	}
	names, err := filepath.Glob(filepath.Join(txnDir(root), "*.json.tmp"))
	if err != nil {
		return err
	}
	locks, err := filepath.Glob(filepath.Join(txnDir(root), "*.lock"))
	if err != nil {
		return err
	}
	ids := map[string]bool{}
	for _, n := range names {
		ids[strings.TrimSuffix(filepath.Base(n), ".json.tmp")] = true
	}
	for _, n := range locks {
		ids[strings.TrimSuffix(filepath.Base(n), ".lock")] = true
	}
	var errs []error
	for id := range ids {
		record := filepath.Join(txnDir(root), id+".json")
		if _, err := os.Lstat(record); err == nil {
			continue // a record: its recovery ends it, and End removes what was written aside
		}
		lock, err := acquire(filepath.Join(txnDir(root), id+".lock"), "")
		if errors.Is(err, ErrBusy) {
			continue // its gpucr lives, and is writing it
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("journal: %w", err))
			continue
		}
		// Held now, it is written by no one: a record that appeared meanwhile is a dead
		// gpucr's too, and its recovery finds it without its lock file.
		if err := os.Remove(record + ".tmp"); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("journal: %w", err))
		}
		lock.Release()
	}
	return errors.Join(errs...)
}

// Release lets a claimed record go without ending it: a recovery that failed leaves it
// stale, for the next one to try, instead of held until this process exits.
func (j *Journal) Release() { j.lock.Release() }

// Entry is a record on disk, and whether an owner (gpucr or its guardian) still holds it.
type Entry struct {
	Record
	Held bool `json:"held"`
}

// List reads every record under root. A record whose lock nobody holds is stale: its
// owner and guardian are gone, and it must be recovered.
func List(root string) ([]Entry, error) {
	if err := trusted(root); err != nil {
		return nil, err
	}
	names, err := filepath.Glob(filepath.Join(txnDir(root), "*.json"))
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, n := range names {
		rec, err := read(n)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, errNotItsRecord) {
			// Ended between the listing and the read; or a file gpucr never wrote (a copy
			// of a record), which must not hold up every recovery (review).
			continue
		}
		if err != nil {
			return nil, err
		}
		held, err := isHeld(filepath.Join(txnDir(root), rec.ID+".lock"))
		if err != nil {
			return nil, err
		}
		out = append(out, Entry{Record: rec, Held: held})
	}
	slices.SortFunc(out, func(a, b Entry) int { return a.Started.Compare(b.Started) })
	return out, nil
}

// HoldingGPU returns the live operation whose record holds pid's device state, nil if
// none does. A restore holds its processes by its record, not by their PIDs' locks (a
// container's are known only once CRIU made them): what would lock or resume such a
// process must ask here as well as take its lock.
func HoldingGPU(root string, pid int) (*Entry, error) {
	entries, err := List(root)
	if err != nil {
		return nil, err
	}
	return HolderIn(entries, pid), nil
}

// HolderIn is the live operation of entries whose record holds pid's device state (pid
// still the process it recorded), nil if none does.
func HolderIn(entries []Entry, pid int) *Entry {
	for i, en := range entries {
		if en.Held && slices.ContainsFunc(en.GPUs, func(g GPUProc) bool { return g.PID == pid && g.Alive() }) {
			return &entries[i]
		}
	}
	return nil
}

// Claim takes over the stale record id, for recovery; ErrBusy if its owner or guardian
// still holds it.
func Claim(root, id string) (*Journal, error) {
	if err := trusted(root); err != nil {
		return nil, err
	}
	lock, err := acquire(filepath.Join(txnDir(root), id+".lock"), "")
	if err != nil {
		return nil, err
	}
	rec, err := read(filepath.Join(txnDir(root), id+".json"))
	if err != nil {
		lock.Release()
		return nil, err
	}
	return &Journal{root: root, rec: rec, lock: lock}, nil
}

// Adopt takes the record id whose lock an owner handed over as f (a guardian's).
func Adopt(root, id string, f *os.File) (*Journal, error) {
	if err := trusted(root); err != nil {
		return nil, err
	}
	rec, err := read(filepath.Join(txnDir(root), id+".json"))
	if err != nil {
		return nil, err
	}
	return &Journal{root: root, rec: rec, lock: &Lock{f: f, path: filepath.Join(txnDir(root), id+".lock")}}, nil
}

// errNotItsRecord is a file of the journal not named by the ID of the record it holds.
var errNotItsRecord = errors.New("does not hold its own record")

func read(path string) (Record, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Record{}, fmt.Errorf("journal: %w", err)
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return Record{}, fmt.Errorf("journal: read %s: %w", path, err)
	}
	if r.ID == "" || filepath.Base(path) != r.ID+".json" {
		return Record{}, fmt.Errorf("journal: %s: %w", path, errNotItsRecord)
	}
	return r, nil
}

func clone(r Record) Record {
	r.Tree = slices.Clone(r.Tree)
	r.GPUs = slices.Clone(r.GPUs)
	r.Paths = slices.Clone(r.Paths)
	r.Locks = slices.Clone(r.Locks)
	if r.THP != nil {
		t := *r.THP
		r.THP = &t
	}
	if r.Container != nil {
		c := *r.Container
		c.Runtime = slices.Clone(c.Runtime)
		r.Container = &c
	}
	return r
}

// Lock is an exclusive lock on a file under the journal's root. The kernel drops it when
// every descriptor of it is closed, so a dead holder never keeps it.
type Lock struct {
	f    *os.File
	path string
}

// LockTarget locks what an operation works on ("pid-4242", "container-web"), refusing with
// ErrBusy, and the holder's description, if another operation holds it.
func LockTarget(root, name, holder string) (*Lock, error) {
	if err := os.MkdirAll(locksDir(root), 0o700); err != nil {
		return nil, fmt.Errorf("lock %s: %w", name, err)
	}
	// Before the lock file is opened and written: through a symlink a user planted there,
	// root wrote the holder's text over another file (review).
	if err := trusted(root); err != nil {
		return nil, err
	}
	return acquire(lockPath(root, name), holder)
}

// LockTargets locks every target of names for holder, all or none: where one is refused it
// lets go of those it took, and returns the index of the one refused with the error.
func LockTargets(root, holder string, names []string) ([]*Lock, int, error) {
	var locks []*Lock
	for i, name := range names {
		l, err := LockTarget(root, name, holder)
		if err != nil {
			for _, l := range locks {
				l.Release()
			}
			return nil, i, err
		}
		locks = append(locks, l)
	}
	return locks, -1, nil
}

func locksDir(root string) string { return filepath.Join(root, "locks") }

func lockPath(root, name string) string { return filepath.Join(locksDir(root), name+".lock") }

// AdoptLock takes the target lock name whose descriptor an owner handed over as f.
func AdoptLock(root, name string, f *os.File) *Lock { return &Lock{f: f, path: lockPath(root, name)} }

// ClearTarget removes the target lock name if nobody holds it: a dead owner's leftover.
func ClearTarget(root, name string) {
	if trusted(root) != nil {
		return
	}
	if l, err := acquire(lockPath(root, name), ""); err == nil {
		l.Release()
	}
}

// File is the lock's descriptor, for a guardian to share.
func (l *Lock) File() *os.File { return l.f }

// acquire locks path, creating it, and writes holder into it. A lock file is removed by
// its releaser, so one opened just before that removal is locked in vain: the inode under
// the path is checked after locking, and the lock taken again on a new file.
func acquire(path, holder string) (*Lock, error) {
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return nil, err
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				b, _ := os.ReadFile(path)
				if h := strings.TrimSpace(string(b)); h != "" {
					return nil, fmt.Errorf("%w: %s", ErrBusy, h)
				}
				return nil, ErrBusy
			}
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		var held, named unix.Stat_t
		if unix.Fstat(int(f.Fd()), &held) != nil || unix.Stat(path, &named) != nil || held.Ino != named.Ino {
			f.Close()
			continue
		}
		if holder != "" {
			_ = f.Truncate(0)
			_, _ = f.WriteAt([]byte(holder+"\n"), 0)
		}
		return &Lock{f: f, path: path}, nil
	}
}

// Release removes and unlocks the lock file.
func (l *Lock) Release() {
	if l == nil || l.f == nil {
		return
	}
	os.Remove(l.path)
	l.f.Close()
	l.f = nil
}

// isHeld reports whether someone holds the lock at path.
func isHeld(path string) (bool, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return true, nil
		}
		return false, err
	}
	_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return false, nil
}
