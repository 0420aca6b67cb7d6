package chunked_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/store"
	"github.com/gpucr/gpucr/internal/store/chunked"
)

// stalling is a store whose lease writes and deletes hang, once a trigger fired, until
// released: a gpucr stopped (SIGSTOP, a frozen cgroup) or a write stuck on a dead
// connection. trigger says which call fires it; a call that fires it hangs too.
type stalling struct {
	store.Store
	trigger func(op, key string) bool
	once    sync.Once
	stalled atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func newStalling(st store.Store, trigger func(op, key string) bool) *stalling {
	return &stalling{Store: st, trigger: trigger, entered: make(chan struct{}), release: make(chan struct{})}
}

func (g *stalling) hang(op, key string) {
	fired := false
	if g.trigger(op, key) {
		g.once.Do(func() { g.stalled.Store(true); fired = true; close(g.entered) })
	}
	if fired || g.stalled.Load() && (op == "delete" || strings.Contains(key, chunked.LeasesDir)) {
		<-g.release
	}
}

func (g *stalling) Put(ctx context.Context, key string, b []byte) error {
	g.hang("put", key)
	return g.Store.Put(ctx, key, b)
}

// Stat hangs once it has its answer: a push that found a chunk stored goes on to reuse it.
func (g *stalling) Stat(ctx context.Context, key string) (int64, error) {
	n, err := g.Store.Stat(ctx, key)
	g.hang("stat", key)
	return n, err
}

func (g *stalling) Delete(ctx context.Context, key string) error {
	g.hang("delete", key)
	return g.Store.Delete(ctx, key)
}

// chunksOfADeletedCheckpoint stores a checkpoint at job/1 and deletes its manifest: its
// chunks are there, referenced by nothing, for a collection to remove and a push to reuse.
func chunksOfADeletedCheckpoint(t *testing.T, st store.Store) string {
	t.Helper()
	src := testImage(t, 0)
	if _, _, err := chunked.Push(context.Background(), st, "job/1", src, chunked.Options{}); err != nil {
		t.Fatal(err)
	}
	if err := st.Delete(context.Background(), chunked.ManifestKey("job/1")); err != nil {
		t.Fatal(err)
	}
	return src
}

// A push whose lease went stale (its writes hung) was taken for dead by a collection,
// which removed the chunks it was reusing; the push then wrote its manifest, and a
// checkpoint listed as complete could not be pulled (review). The push checks its chunks
// before its manifest: it fails, asking to push again, and nothing is listed.
func TestPushWhoseLeaseWentStaleChecksItsChunks(t *testing.T) {
	chunked.SetLeaseTiming(t.Cleanup, 100*time.Millisecond, time.Second)
	ctx := context.Background()
	st := store.NewDir(t.TempDir())
	src := chunksOfADeletedCheckpoint(t, st)
	g := newStalling(st, func(op, key string) bool { return op == "stat" && strings.Contains(key, "/"+chunked.ChunksDir+"/") })
	done := pushBehind(ctx, g, "job/2", src)
	<-g.entered
	time.Sleep(1500 * time.Millisecond) // the push's lease is stale
	c, err := chunked.Collect(ctx, st, "job", false)
	if err != nil || c.Removed == 0 {
		t.Fatalf("collection beside the stalled push: %+v, %v; want it to remove the unreferenced chunks", c, err)
	}
	close(g.release)
	err = <-done
	if err == nil || !strings.Contains(err.Error(), "push again") {
		t.Fatalf("push whose chunks were removed = %v, want it to fail and say to push again", err)
	}
	if ls, err := chunked.List(ctx, st, "job"); err != nil || len(ls) != 0 {
		t.Fatalf("listed %+v, %v; want no checkpoint", ls, err)
	}
	if _, _, err := chunked.Push(ctx, st, "job/2", src, chunked.Options{}); err != nil {
		t.Fatalf("pushing again: %v", err)
	}
	if _, _, err := chunked.Pull(ctx, st, "job/2", t.TempDir()+"/img", chunked.Options{}); err != nil {
		t.Fatalf("pull of the push made again: %v", err)
	}
}

// A collection stopped once it had found no push, its lease gone stale meanwhile, let a
// push run and store a checkpoint reusing the chunks it was about to remove; resumed, it
// removed them (review). It removes nothing once its lease lapsed, and stops.
func TestCollectionWhoseLeaseWentStaleStops(t *testing.T) {
	chunked.SetLeaseTiming(t.Cleanup, 100*time.Millisecond, time.Second)
	ctx := context.Background()
	st := store.NewDir(t.TempDir())
	src := chunksOfADeletedCheckpoint(t, st)
	g := newStalling(st, func(op, _ string) bool { return op == "delete" })
	type result struct {
		c   *chunked.Collected
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := chunked.Collect(ctx, g, "job", false)
		done <- result{c, err}
	}()
	<-g.entered
	time.Sleep(1500 * time.Millisecond) // the collection's lease is stale
	if _, _, err := chunked.Push(ctx, st, "job/2", src, chunked.Options{}); err != nil {
		t.Fatalf("push beside the stalled collection: %v", err)
	}
	close(g.release)
	r := <-done
	if r.err != nil || !r.c.Stopped {
		t.Fatalf("collection resumed = %+v, %v; want it stopped", r.c, r.err)
	}
	if _, _, err := chunked.Pull(ctx, st, "job/2", t.TempDir()+"/img", chunked.Options{}); err != nil {
		t.Fatalf("the push's checkpoint after the collection: %v", err)
	}
}

// answerLost is a store whose first conditional create lands but answers as its retry
// does, once the first answer was lost: the object exists.
type answerLost struct {
	store.Store
	once sync.Once
}

func (a *answerLost) Create(ctx context.Context, key string, b []byte) error {
	err := a.Store.Create(ctx, key, b)
	a.once.Do(func() {
		if err == nil {
			err = fmt.Errorf("%s: %w", key, store.ErrExists)
		}
	})
	return err
}

// A manifest write sent again after its answer was lost found the manifest its first one
// made, and the push said a checkpoint was already there (review): its own is taken for
// done; another's still is not.
func TestManifestWrittenTwiceByItsPushIsDone(t *testing.T) {
	ctx := context.Background()
	st := store.NewDir(t.TempDir())
	src := testImage(t, 0)
	if _, _, err := chunked.Push(ctx, &answerLost{Store: st}, "job/1", src, chunked.Options{}); err != nil {
		t.Fatalf("push whose manifest write was answered as taken: %v", err)
	}
	if _, _, err := chunked.Pull(ctx, st, "job/1", t.TempDir()+"/img", chunked.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := chunked.Push(ctx, st, "job/1", src, chunked.Options{}); !errors.Is(err, chunked.ErrExists) {
		t.Fatalf("a second push to a taken name: %v, want ErrExists", err)
	}
}

// deafDeletes is a store that stopped answering deletes: each waits for its context.
type deafDeletes struct{ store.Store }

func (d deafDeletes) Delete(ctx context.Context, _ string) error {
	<-ctx.Done()
	return ctx.Err()
}

// A push given up deletes its lease, best effort: against a store that stopped answering,
// that deletion held a failed checkpoint --to, and the locks on its workload, for minutes
// of stalled tries (hostile test). It gives up within the lease's life.
func TestAPushGivenUpDoesNotWaitOnItsLease(t *testing.T) {
	chunked.SetLeaseTiming(t.Cleanup, 100*time.Millisecond, time.Second)
	st := deafDeletes{store.NewDir(t.TempDir())}
	s, err := chunked.NewStream(context.Background(), st, "job/1", chunked.Options{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { s.Abort(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the abort still waits on its lease's deletion")
	}
}

// stallingCreate hangs the manifest's create, and the lease writes once it does (a push
// host cut off from its store), until released.
type stallingCreate struct {
	store.Store
	entered, release chan struct{}
	once             sync.Once
	stalled          atomic.Bool
}

func (g *stallingCreate) Create(ctx context.Context, key string, b []byte) error {
	if strings.HasSuffix(key, chunked.ManifestObject) {
		g.once.Do(func() { g.stalled.Store(true); close(g.entered); <-g.release })
	}
	return g.Store.Create(ctx, key, b)
}

func (g *stallingCreate) Put(ctx context.Context, key string, b []byte) error {
	if g.stalled.Load() && strings.Contains(key, chunked.LeasesDir) {
		<-g.release
	}
	return g.Store.Put(ctx, key, b)
}

// A push's lease could lapse after its chunks were checked, while its manifest was being
// written, and a collection then removed the chunks the manifest names (review). The push
// checks them again once the manifest is written: it fails, and removes the manifest.
func TestPushWhoseLeaseLapsedWhileItsManifestWasWrittenChecksAgain(t *testing.T) {
	chunked.SetLeaseTiming(t.Cleanup, 100*time.Millisecond, time.Second)
	ctx := context.Background()
	st := store.NewDir(t.TempDir())
	src := chunksOfADeletedCheckpoint(t, st)
	g := &stallingCreate{Store: st, entered: make(chan struct{}), release: make(chan struct{})}
	done := pushBehind(ctx, g, "job/2", src)
	<-g.entered
	time.Sleep(1500 * time.Millisecond) // the push's lease is stale
	if c, err := chunked.Collect(ctx, st, "job", false); err != nil || c.Removed == 0 {
		t.Fatalf("collection beside the stalled manifest: %+v, %v; want the chunks removed", c, err)
	}
	close(g.release)
	if err := <-done; err == nil || !strings.Contains(err.Error(), "push again") {
		t.Fatalf("push = %v, want it to fail and say to push again", err)
	}
	if ls, err := chunked.List(ctx, st, "job"); err != nil || len(ls) != 0 {
		t.Fatalf("listed %+v, %v; want no checkpoint", ls, err)
	}
}

// A live push's lease dated ahead of a collection's own, as a local store's are once the
// host's clock steps back (NTP), was skipped as one whose time was set by hand, and the
// collection removed the chunks the push reused (review). A little ahead still counts.
func TestLeaseDatedAheadByAClockStepCounts(t *testing.T) {
	chunked.SetLeaseTiming(t.Cleanup, 3*time.Second, 8*time.Second)
	ctx := context.Background()
	root := t.TempDir()
	st := store.NewDir(root)
	src := chunksOfADeletedCheckpoint(t, st)
	g := newStalling(st, func(op, key string) bool { return op == "stat" && strings.Contains(key, "/"+chunked.ChunksDir+"/") })
	done := pushBehind(ctx, g, "job/2", src)
	<-g.entered
	leases, err := filepath.Glob(filepath.Join(root, "job", chunked.LeasesDir, "write-*"))
	if err != nil || len(leases) != 1 {
		t.Fatalf("the push's lease: %v, %v", leases, err)
	}
	ahead := time.Now().Add(30 * time.Second) // the clock stepped back 30 s since it was written
	if err := os.Chtimes(leases[0], ahead, ahead); err != nil {
		t.Fatal(err)
	}
	_, cerr := chunked.Collect(ctx, st, "job", false)
	close(g.release)
	if err := <-done; err != nil {
		t.Fatalf("push: %v", err)
	}
	if !errors.Is(cerr, chunked.ErrBusy) {
		t.Fatalf("collection beside the live push = %v, want it refused as busy", cerr)
	}
	if _, _, err := chunked.Pull(ctx, st, "job/2", filepath.Join(t.TempDir(), "img"), chunked.Options{}); err != nil {
		t.Fatalf("the push's checkpoint: %v", err)
	}
}

// flakyCheck is stallingCreate whose first chunk lookup after the manifest was written
// fails for a moment, as a busy service answers: no chunk is missing.
type flakyCheck struct {
	stallingCreate
	created, failed atomic.Bool
}

func (g *flakyCheck) Create(ctx context.Context, key string, b []byte) error {
	err := g.stallingCreate.Create(ctx, key, b)
	g.created.Store(true)
	return err
}

func (g *flakyCheck) Stat(ctx context.Context, key string) (int64, error) {
	if g.created.Load() && strings.Contains(key, "/"+chunked.ChunksDir+"/") && g.failed.CompareAndSwap(false, true) {
		return 0, errors.New("503 SlowDown")
	}
	return g.stallingCreate.Stat(ctx, key)
}

// lostAnswer is stallingCreate whose manifest write lands but answers with an error, as a
// write whose answer was lost does.
type lostAnswer struct{ stallingCreate }

func (g *lostAnswer) Create(ctx context.Context, key string, b []byte) error {
	if err := g.stallingCreate.Create(ctx, key, b); err != nil {
		return err
	}
	return errors.New("write manifest: connection reset by peer")
}

// After a lapse the chunks are checked again; a check that failed for a moment removed a
// manifest whose chunks were all there (review): kept, and the push says it is unconfirmed.
// A write whose answer was lost after a lapse left a manifest naming removed chunks listed
// (review): it is checked as a written one is, and removed.
func TestManifestAfterALapseIsKeptOrRemovedForWhatItNames(t *testing.T) {
	chunked.SetLeaseTiming(t.Cleanup, 100*time.Millisecond, time.Second)
	ctx := context.Background()

	st := store.NewDir(t.TempDir())
	src := testImage(t, 0)
	flaky := &flakyCheck{stallingCreate: stallingCreate{Store: st, entered: make(chan struct{}), release: make(chan struct{})}}
	done := make(chan error, 1)
	go func() { _, _, err := chunked.Push(ctx, flaky, "job/1", src, chunked.Options{Workers: 1}); done <- err }()
	<-flaky.entered
	time.Sleep(1500 * time.Millisecond) // the lease lapses; no collection runs
	close(flaky.release)
	if err := <-done; err == nil || !strings.Contains(err.Error(), "is stored, but its chunks could not be checked") {
		t.Fatalf("push whose check failed for a moment = %v, want it to say the checkpoint is stored, unconfirmed", err)
	}
	if _, _, err := chunked.Pull(ctx, st, "job/1", filepath.Join(t.TempDir(), "img"), chunked.Options{}); err != nil {
		t.Fatalf("the kept checkpoint: %v", err)
	}

	st = store.NewDir(t.TempDir())
	src = chunksOfADeletedCheckpoint(t, st)
	lost := &lostAnswer{stallingCreate{Store: st, entered: make(chan struct{}), release: make(chan struct{})}}
	go func() { _, _, err := chunked.Push(ctx, lost, "job/2", src, chunked.Options{Workers: 1}); done <- err }()
	<-lost.entered
	time.Sleep(1500 * time.Millisecond)
	if c, err := chunked.Collect(ctx, st, "job", false); err != nil || c.Removed == 0 {
		t.Fatalf("collection beside the stalled manifest: %+v, %v", c, err)
	}
	close(lost.release)
	if err := <-done; err == nil || !strings.Contains(err.Error(), "push again") {
		t.Fatalf("push whose manifest's answer was lost = %v, want it to fail and say to push again", err)
	}
	if ls, err := chunked.List(ctx, st, "job"); err != nil || len(ls) != 0 {
		t.Fatalf("listed %+v, %v; want nothing", ls, err)
	}
}

// pushBehind pushes the image in src to prefix of st in the background, one worker, and
// sends its outcome.
func pushBehind(ctx context.Context, st store.Store, prefix, src string) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, _, err := chunked.Push(ctx, st, prefix, src, chunked.Options{Workers: 1})
		done <- err
	}()
	return done
}
