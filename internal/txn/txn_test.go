package txn

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestTargetLockExcludesAndNamesTheHolder(t *testing.T) {
	root := t.TempDir()
	a, err := LockTarget(root, "pid-42", "gpucr PID 7 is running a checkpoint of PID 42")
	if err != nil {
		t.Fatal(err)
	}
	_, err = LockTarget(root, "pid-42", "second")
	if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "checkpoint of PID 42") {
		t.Fatalf("second lock: %v, want ErrBusy naming the holder", err)
	}
	a.Release()
	if _, err := os.Stat(filepath.Join(root, "locks", "pid-42.lock")); !os.IsNotExist(err) {
		t.Errorf("released lock file still there: %v", err)
	}
	b, err := LockTarget(root, "pid-42", "third")
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	b.Release()
}

func TestJournalIsStaleOnlyWhenNobodyHoldsIt(t *testing.T) {
	root := t.TempDir()
	j, err := Begin(root, OpCheckpoint, "PID 1234")
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Update(func(r *Record) { r.Paths = []string{"/x"}; r.Phase = "criu-dump" }); err != nil {
		t.Fatal(err)
	}
	entries, err := List(root)
	if err != nil || len(entries) != 1 || !entries[0].Held || entries[0].Phase != "criu-dump" {
		t.Fatalf("List = %+v, %v: want one held record in criu-dump", entries, err)
	}
	if _, err := Claim(root, j.ID()); !errors.Is(err, ErrBusy) {
		t.Fatalf("Claim of a held record: %v, want ErrBusy", err)
	}
	// The owner dies: its descriptor closes, the record stays, and it can be claimed.
	j.lock.f.Close()
	entries, _ = List(root)
	if len(entries) != 1 || entries[0].Held {
		t.Fatalf("after the owner's death List = %+v, want one stale record", entries)
	}
	c, err := Claim(root, j.ID())
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Record(); got.Target != "PID 1234" || len(got.Paths) != 1 {
		t.Errorf("claimed record %+v", got)
	}
	if err := c.End(); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(filepath.Join(root, "txn")); len(left) != 0 {
		t.Errorf("left in the journal: %v", left)
	}
}

func TestLockOutlivesOwnerWhileAChildHoldsIt(t *testing.T) {
	// A guardian holds the journal's lock through an inherited descriptor: the record is
	// not stale while it lives, though gpucr's own descriptor is gone.
	root := t.TempDir()
	j, err := Begin(root, OpRestore, "image /x")
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command("sleep", "30")
	child.ExtraFiles = []*os.File{j.LockFile()}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	j.lock.f.Close()
	if entries, _ := List(root); len(entries) != 1 || !entries[0].Held {
		t.Fatalf("List = %+v, want the record held by the child", entries)
	}
	_ = child.Process.Kill()
	_ = child.Wait()
	if entries, _ := List(root); len(entries) != 1 || entries[0].Held {
		t.Fatalf("List = %+v, want the record stale once the child died", entries)
	}
}

// A record that ends while the journal is listed (its file gone between the listing and the
// read, as a dangling name stands in for here) is not listed, and fails nothing.
func TestListSkipsARecordThatEnded(t *testing.T) {
	root := t.TempDir()
	j, err := Begin(root, OpRestore, "image /x")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = j.End() }()
	if err := os.Symlink(filepath.Join(root, "gone"), filepath.Join(txnDir(root), "restore-ended.json")); err != nil {
		t.Fatal(err)
	}
	entries, err := List(root)
	if err != nil || len(entries) != 1 || entries[0].ID != j.ID() {
		t.Fatalf("List = %+v, %v; want the one live record", entries, err)
	}
}

// Run as root, the journal acts only where root alone can change it: a record planted in a
// run directory others can write named a command root ran and a file it wrote (hostile
// test). Nothing is listed, claimed or begun there.
func TestJournalOthersCanWriteIsRefused(t *testing.T) {
	open, root := runDirOthersCanWrite(t)
	if err := os.MkdirAll(txnDir(root), 0o700); err != nil {
		t.Fatal(err)
	}
	planted := `{"id":"checkpoint-aaaaaaaaaaaa","op":"checkpoint","target":"PID 1","owner":{"pid":1,"start":1},"started":"2026-01-01T00:00:00Z","phase":"x"}`
	if err := os.WriteFile(filepath.Join(txnDir(root), "checkpoint-aaaaaaaaaaaa.json"), []byte(planted), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := List(root); !errors.Is(err, ErrUntrusted) {
		t.Errorf("List = %v, want ErrUntrusted", err)
	}
	if _, err := Claim(root, "checkpoint-aaaaaaaaaaaa"); !errors.Is(err, ErrUntrusted) {
		t.Errorf("Claim = %v, want ErrUntrusted", err)
	}
	if _, err := Begin(root, "checkpoint", "PID 2"); !errors.Is(err, ErrUntrusted) {
		t.Errorf("Begin = %v, want ErrUntrusted", err)
	}
	// The same journal in a directory only root can write is read as before.
	if err := os.Chmod(open, 0o755); err != nil {
		t.Fatal(err)
	}
	if entries, err := List(root); err != nil || len(entries) != 1 {
		t.Errorf("List of a root-only journal = %v, %v", entries, err)
	}
}

// A record is its file's only when the file is named by its ID: one whose ID is a suffix of
// its name ("zzz.json" holding "zz") was listed as cut off for good and never recovered
// (hostile test). Such a file is passed over, not an error that would hold up every
// recovery (review).
func TestRecordNamedOtherThanItsIDIsRefused(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(txnDir(root), 0o700); err != nil {
		t.Fatal(err)
	}
	rec := `{"id":"zz","op":"checkpoint","target":"PID 1","owner":{"pid":1,"start":1},"started":"2026-01-01T00:00:00Z","phase":"x"}`
	if err := os.WriteFile(filepath.Join(txnDir(root), "zzz.json"), []byte(rec), 0o600); err != nil {
		t.Fatal(err)
	}
	if entries, err := List(root); err != nil || len(entries) != 0 {
		t.Errorf("List = %+v, %v; want the misnamed record passed over", entries, err)
	}
}

// Locks are taken only where the journal is trusted, and a lock file is never opened
// through a symlink: one planted in locks/ of a run directory others could write had root
// write the holder's text over the file it pointed to, before the journal refused (review).
// A txn/ that is root's but sticky and writable by all takes anyone's records: refused too.
func TestLocksAndStickyJournalsOthersCanWriteAreRefused(t *testing.T) {
	_, root := runDirOthersCanWrite(t)
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("root's\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(locksDir(root), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, lockPath(root, "pid-4242")); err != nil {
		t.Fatal(err)
	}
	if _, err := LockTarget(root, "pid-4242", "gpucr PID 1 is running a checkpoint of PID 4242"); !errors.Is(err, ErrUntrusted) {
		t.Errorf("LockTarget = %v, want ErrUntrusted", err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "root's\n" {
		t.Errorf("the file a planted lock pointed to now holds %q", b)
	}

	sticky := filepath.Join(t.TempDir(), "run")
	if err := os.MkdirAll(txnDir(sticky), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(txnDir(sticky), 0o1777); err != nil {
		t.Fatal(err)
	}
	if _, err := List(sticky); !errors.Is(err, ErrUntrusted) {
		t.Errorf("List of a sticky txn/ all may write = %v, want ErrUntrusted", err)
	}
}

// runDirOthersCanWrite is a run directory, root, in a directory, open, that all may write;
// the test is skipped unless it runs as root, the only one the journal's trust concerns.
func runDirOthersCanWrite(t *testing.T) (open, root string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the journal is trusted only when root runs it")
	}
	open = t.TempDir()
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	return open, filepath.Join(open, "run")
}

// A gpucr killed while it wrote its first record left an empty ID.json.tmp and its lock for
// good: nothing read or removed them (hostile test). Sweep removes those whose owner is
// gone, and leaves a live gpucr's, and a record's, alone.
func TestSweepRemovesWhatAKilledWriterLeft(t *testing.T) {
	root := t.TempDir()
	live, err := Begin(root, OpRestore, "image /x")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = live.End() }()
	dir := txnDir(root)
	liveTmp := live.path() + ".tmp"
	killed := filepath.Join(dir, "restore-0123456789ab")
	for _, f := range []string{killed + ".json.tmp", killed + ".lock", liveTmp, filepath.Join(dir, "checkpoint-aaaaaaaaaaaa.lock")} {
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := Sweep(root); err != nil {
		t.Fatal(err)
	}
	for _, gone := range []string{killed + ".json.tmp", killed + ".lock", filepath.Join(dir, "checkpoint-aaaaaaaaaaaa.lock")} {
		if _, err := os.Lstat(gone); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: %v, want it removed", filepath.Base(gone), err)
		}
	}
	for _, kept := range []string{live.path(), liveTmp, filepath.Join(dir, live.ID()+".lock")} {
		if _, err := os.Lstat(kept); err != nil {
			t.Errorf("%s of a live gpucr: %v, want it kept", filepath.Base(kept), err)
		}
	}
	if entries, err := List(root); err != nil || len(entries) != 1 || !entries[0].Held {
		t.Fatalf("List = %+v, %v; want the live record, held", entries, err)
	}
}

// gpucr check called a process held by a live operation stranded when a later record named
// its PID without holding it, and took a recorded PID that another process has since for
// the recorded one (review): the holder is the live record of that very process.
func TestHolderInIsTheLiveRecordOfThatProcess(t *testing.T) {
	self, err := ProcOf(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	reused := self
	reused.Start++
	held := Entry{Record: Record{ID: "held", GPUs: []GPUProc{{Backend: "nvidia", Proc: self}}}, Held: true}
	later := Entry{Record: Record{ID: "later", GPUs: []GPUProc{{Backend: "nvidia", Proc: self}}}}
	if en := HolderIn([]Entry{held, later}, self.PID); en == nil || en.ID != "held" {
		t.Fatalf("holder %+v, want the held record", en)
	}
	if en := HolderIn([]Entry{later}, self.PID); en != nil {
		t.Fatalf("a record not held holds %d: %+v", self.PID, en)
	}
	old := Entry{Record: Record{ID: "old", GPUs: []GPUProc{{Backend: "nvidia", Proc: reused}}}, Held: true}
	if en := HolderIn([]Entry{old}, self.PID); en != nil {
		t.Fatalf("a record of another process at PID %d holds it: %+v", self.PID, en)
	}
}
