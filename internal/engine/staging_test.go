package engine

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/image/imagetest"
	"github.com/gpucr/gpucr/internal/testutil"
	"github.com/gpucr/gpucr/internal/txn"
)

// A staging directory whose gpucr died is removed by recovery, but not while a live
// operation (a restore's guardian rolling back) journals it too and may still read it.
// The rollback of that operation ends the staging record with it. Closed, a staging
// leaves neither directory nor record.
func TestStagingDirOfADeadGpucrIsRecovered(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "needs root")
	}
	root := t.TempDir()
	t.Setenv("TMPDIR", t.TempDir())
	s, err := NewStagingDir(root, "restore --from test", "gpucr-stream-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.Dir, "pstree.img"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	live, err := txn.Begin(root, txn.OpRestore, "test")
	if err != nil {
		t.Fatal(err)
	}
	if err := live.Update(func(r *txn.Record) { r.Paths = []string{filepath.Join(s.Dir, "image")} }); err != nil {
		t.Fatal(err)
	}
	// The staging's owner dies: nobody holds its record any more.
	if err := os.Remove(filepath.Join(root, "txn", s.j.ID()+".lock")); err != nil {
		t.Fatal(err)
	}
	e := &Engine{JournalRoot: root}
	if done, err := e.RecoverStale(); err != nil || len(done) != 0 {
		t.Fatalf("recovered %+v (%v) while a live operation journals the directory", done, err)
	}
	if _, err := os.Stat(s.Dir); err != nil {
		t.Fatalf("the staging directory went while a live operation journals it: %v", err)
	}
	if err := live.End(); err != nil {
		t.Fatal(err)
	}
	done, err := e.RecoverStale()
	if err != nil || len(done) != 1 || done[0].Op != txn.OpStaging {
		t.Fatalf("recovered %+v (%v), want the staging", done, err)
	}
	if _, err := os.Stat(s.Dir); !os.IsNotExist(err) {
		t.Fatalf("the staging directory is left: %v", err)
	}

	// The rollback of the dead gpucr's operation removes the directory, and with it ends
	// the staging record: the next gpucr finds nothing to do.
	s3, err := NewStagingDir(root, "restore --from test", "gpucr-stream-")
	if err != nil {
		t.Fatal(err)
	}
	op, err := txn.Begin(root, txn.OpRestore, "test")
	if err != nil {
		t.Fatal(err)
	}
	if err := op.Update(func(r *txn.Record) { r.Paths = []string{s3.Dir} }); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(root, "txn", s3.j.ID()+".lock")); err != nil {
		t.Fatal(err)
	}
	if err := e.Recover(context.Background(), op); err != nil {
		t.Fatal(err)
	}
	if ops, err := txn.List(root); err != nil || len(ops) != 0 {
		t.Fatalf("after the operation's rollback the journal holds %+v (%v)", ops, err)
	}
	if _, err := os.Stat(s3.Dir); !os.IsNotExist(err) {
		t.Fatalf("the rollback left the staging directory: %v", err)
	}

	s2, err := NewStagingDir(root, "checkpoint --to test", "gpucr-stream-")
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
	left, _ := filepath.Glob(filepath.Join(os.Getenv("TMPDIR"), "gpucr-stream-*"))
	if ops, err := txn.List(root); err != nil || len(ops) != 0 || len(left) != 0 {
		t.Fatalf("a closed staging left records %+v (%v), directories %v", ops, err, left)
	}
}

// An export's image directory (Keep) is the job's only copy once its checkpoint committed
// there: recovery keeps it when it holds an image and says so, removes it while empty, and
// removes it whole once the archive is packed (Discard), however little of it is left.
func TestExportImageDirectoryOfADeadGpucr(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "needs root")
	}
	root := t.TempDir()
	m := &image.Manifest{GpucrVersion: "test", Created: time.Now().UTC(), RootPID: 42,
		Host: image.HostInfo{Hostname: "h"}, Processes: []image.Process{{PID: 42, PPID: 1, Command: "counter", Threads: 1}}}
	staged := func(dir string, discard bool) *StagingDir {
		t.Helper()
		s, err := NewStagingBeside(root, "export", dir+".tar")
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Keep(dir); err != nil {
			t.Fatal(err)
		}
		if discard {
			if err := s.Discard(dir); err != nil {
				t.Fatal(err)
			}
		}
		return s
	}
	whole := imagetest.Commit(t, map[string][]byte{"criu/pstree.img": []byte("pstree")}, m, nil)
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.Mkdir(empty, 0o700); err != nil {
		t.Fatal(err)
	}
	packed := imagetest.Commit(t, map[string][]byte{"criu/pstree.img": []byte("pstree")}, m, nil)
	// Each begun while the others' gpucrs live (a staging recovers the stale ones first).
	all := []*StagingDir{staged(whole, false), staged(empty, false), staged(packed, true)}
	for _, s := range all {
		// Its gpucr dies: nobody holds its record any more.
		if err := os.Remove(filepath.Join(root, "txn", s.j.ID()+".lock")); err != nil {
			t.Fatal(err)
		}
	}

	done, err := (&Engine{JournalRoot: root}).RecoverStale()
	if err != nil || len(done) != 3 {
		t.Fatalf("recovered %+v, %v; want the three stagings", done, err)
	}
	for _, r := range done {
		if want := r.Image == whole; r.Committed != want {
			t.Errorf("record of %q: committed %v, want %v", r.Image, r.Committed, want)
		}
	}
	if _, err := image.Load(whole); err != nil {
		t.Errorf("the whole image was not kept: %v", err)
	}
	for _, gone := range []string{empty, packed} {
		if _, err := os.Stat(gone); !os.IsNotExist(err) {
			t.Errorf("%s is left: %v", gone, err)
		}
	}
}

// Killed pulls left their copies beside their destinations, each up to an image, until
// gpucr recover: pull, fold and import run no engine, and so no recovery (hostile test: a
// later pull was refused for the room they took). A staging begins with the recovery of
// stale ones.
func TestStagingRecoversStaleStagingFirst(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "the journal is root's")
	}
	root := t.TempDir()
	left := filepath.Join(t.TempDir(), ".img.partial-dead")
	if err := os.Mkdir(left, 0o700); err != nil {
		t.Fatal(err)
	}
	dead, err := txn.Begin(root, txn.OpStaging, "pull s3://b/x")
	if err != nil {
		t.Fatal(err)
	}
	if err := dead.Update(func(r *txn.Record) { r.Paths = []string{left} }); err != nil {
		t.Fatal(err)
	}
	_ = dead.LockFile().Close() // its gpucr was killed
	s, err := NewStagingBeside(root, "pull s3://b/y", filepath.Join(t.TempDir(), "img"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	if _, err := os.Stat(left); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a killed pull's copy is left: %v", err)
	}
	entries, err := txn.List(root)
	if err != nil || len(entries) != 1 || entries[0].ID != s.ID() {
		t.Errorf("journal %+v, %v: want only the new staging", entries, err)
	}

	// An export's, whose image may be a job's only copy, waits for a recovery that says
	// where that image is.
	export, err := NewStagingBeside(root, "export of container c to /x.tar", filepath.Join(t.TempDir(), "x.tar"))
	if err != nil {
		t.Fatal(err)
	}
	if err := export.Keep(filepath.Join(t.TempDir(), "x.image")); err != nil {
		t.Fatal(err)
	}
	_ = export.j.LockFile().Close() // its gpucr was killed
	again, err := NewStagingBeside(root, "pull s3://b/z", filepath.Join(t.TempDir(), "img"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = again.Close() }()
	if entries, _ := txn.List(root); !slices.ContainsFunc(entries, func(en txn.Entry) bool { return en.ID == export.ID() }) {
		t.Error("a killed export's record was ended by a staging's recovery, which tells no one of its image")
	}
}

// A destination whose name leaves no room for its staging name beside it (an export to a
// 240-character FILE) is refused before anything is journaled: the staging could be neither
// made nor removed, the export failed only after its container had been checkpointed and
// removed, and the record failed every gpucr recover after (hostile test).
func TestStagingNameTooLongIsRefusedFirst(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "needs root")
	}
	root, dir := t.TempDir(), t.TempDir()
	long := filepath.Join(dir, strings.Repeat("a", 236)+".tar")
	s, err := NewStagingBeside(root, "export to a long name", long)
	if !errors.Is(err, ErrNameTooLong) {
		if s != nil {
			_ = s.Close()
		}
		t.Fatalf("staging beside a %d-byte name: %v, want %v", len(filepath.Base(long)), err, ErrNameTooLong)
	}
	if recs, _ := filepath.Glob(filepath.Join(root, "txn", "*.json")); len(recs) != 0 {
		t.Fatalf("records left: %v", recs)
	}
	s, err = NewStagingBeside(root, "export to a name that fits", filepath.Join(dir, strings.Repeat("a", 200)+".tar"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
