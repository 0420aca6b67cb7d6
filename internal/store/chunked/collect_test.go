package chunked_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/store"
	"github.com/gpucr/gpucr/internal/store/chunked"
	"github.com/gpucr/gpucr/internal/store/storetest"
	"github.com/gpucr/gpucr/internal/testutil"
)

// chunkNames lists the chunks stored in dir.
func chunkNames(t *testing.T, st store.Store, dir string) []string {
	t.Helper()
	es, err := st.List(context.Background(), dir+"/"+chunked.ChunksDir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

// referencedBy lists the chunks the checkpoints at prefixes reference.
func referencedBy(t *testing.T, st store.Store, prefixes ...string) []string {
	t.Helper()
	seen := map[string]bool{}
	for _, p := range prefixes {
		m, err := chunked.Load(context.Background(), st, p)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range m.Files {
			for _, c := range f.Chunks {
				if !c.Zero {
					seen[c.SHA256] = true
				}
			}
		}
	}
	out := make([]string, 0, len(seen))
	for s := range seen {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

func pullSame(t *testing.T, st store.Store, prefix, want string) {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "img")
	if _, _, err := chunked.Pull(context.Background(), st, prefix, dst, chunked.Options{}); err != nil {
		t.Fatalf("pull %s: %v", prefix, err)
	}
	sameTree(t, want, dst)
}

// Deleting a checkpoint removes it and the chunks only it (or an unfinished push)
// referenced; its sibling keeps every chunk it needs and pulls whole.
func TestDeleteCollectsWhatNothingReferences(t *testing.T) {
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			st := open(t)
			one, two := testImage(t, 0), testImage(t, 1)
			for p, dir := range map[string]string{"job/1": one, "job/2": two} {
				if _, _, err := chunked.Push(ctx, st, p, dir, chunked.Options{}); err != nil {
					t.Fatal(err)
				}
			}
			// A push cut off halfway leaves chunks nothing references.
			if _, _, err := chunked.Push(ctx, &cutStore{Store: st, after: 2}, "job/3", testImage(t, 7), chunked.Options{Workers: 1}); err == nil {
				t.Fatal("the cut push succeeded")
			}
			orphans := len(chunkNames(t, st, "job")) - len(referencedBy(t, st, "job/1", "job/2"))
			if orphans < 1 {
				t.Fatalf("the cut push left no chunk behind")
			}

			dry, err := chunked.Collect(ctx, st, "job", true)
			if err != nil || dry.Removed != orphans || dry.Checkpoints != 2 {
				t.Fatalf("dry run = %+v, %v; want %d orphans of 2 checkpoints", dry, err, orphans)
			}
			if n := len(chunkNames(t, st, "job")); n != dry.Kept+orphans {
				t.Fatalf("the dry run removed chunks: %d left", n)
			}

			c, err := chunked.Delete(ctx, st, "job/1")
			if err != nil {
				t.Fatal(err)
			}
			if got, want := chunkNames(t, st, "job"), referencedBy(t, st, "job/2"); !sameNames(got, want) {
				t.Fatalf("after deleting job/1 the store holds %d chunks, job/2 references %d", len(got), len(want))
			}
			if c.Removed <= orphans || c.Checkpoints != 1 || c.RemovedBytes <= 0 {
				t.Errorf("delete = %+v", c)
			}
			if _, err := chunked.Load(ctx, st, "job/1"); !errors.Is(err, chunked.ErrNoCheckpoint) {
				t.Errorf("job/1 after delete: %v", err)
			}
			pullSame(t, st, "job/2", two)

			if _, err := chunked.Delete(ctx, st, "job/1"); !errors.Is(err, chunked.ErrNoCheckpoint) {
				t.Errorf("deleting it again = %v, want ErrNoCheckpoint", err)
			}
			if _, err := chunked.Delete(ctx, st, "job/2"); err != nil {
				t.Fatal(err)
			}
			if left := chunkNames(t, st, "job"); len(left) != 0 {
				t.Errorf("%d chunks left with no checkpoint", len(left))
			}
		})
	}
}

func sameNames(a, b []string) bool { return strings.Join(a, ",") == strings.Join(b, ",") }

// A manifest the collection cannot read leaves every chunk in place: its chunks are unknown.
func TestCollectRemovesNothingBesideAnUnreadableManifest(t *testing.T) {
	ctx := context.Background()
	st := store.NewDir(t.TempDir())
	if _, _, err := chunked.Push(ctx, st, "job/1", testImage(t, 0), chunked.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := chunked.Push(ctx, &cutStore{Store: st, after: 2}, "job/2", testImage(t, 7), chunked.Options{Workers: 1}); err == nil {
		t.Fatal("the cut push succeeded")
	}
	newer := []byte(`{"format": 99}`)
	if err := st.Put(ctx, chunked.ManifestKey("job/future"), newer); err != nil {
		t.Fatal(err)
	}
	before := chunkNames(t, st, "job")
	if _, err := chunked.Collect(ctx, st, "job", false); !errors.Is(err, chunked.ErrNewerFormat) || !strings.Contains(err.Error(), "nothing was removed") {
		t.Fatalf("collect = %v, want a refusal naming the newer manifest", err)
	}
	if after := chunkNames(t, st, "job"); !sameNames(before, after) {
		t.Fatalf("chunks removed: %d of %d left", len(after), len(before))
	}
}

// A push that has to wait for a collection to stop says so once, naming it, before it
// waits: it showed nothing but "0 B" for the minute it waited (hostile test).
func TestPushWaitingForACollectionSaysSo(t *testing.T) {
	// The collection's lease goes stale after a second with nothing renewing it: the push
	// must meet it live, so the image is made first (under CI's load, making it after the
	// lease took longer than the 300 ms the lease once had, and the push met it stale).
	chunked.SetLeaseTiming(t.Cleanup, 50*time.Millisecond, time.Second)
	ctx := context.Background()
	st := store.NewDir(t.TempDir())
	img := testImage(t, 0)
	key := "job/" + chunked.LeasesDir + "/" + chunked.LeaseName("collect", "there", "otherboot.1", 77, 1)
	if err := st.Put(ctx, key, []byte("x")); err != nil {
		t.Fatal(err)
	}
	var heard []string
	_, _, err := chunked.Push(ctx, st, "job/1", img, chunked.Options{Waiting: func(what string) { heard = append(heard, what) }})
	if len(heard) != 1 || !strings.Contains(heard[0], "a collection by gpucr 77 on there") {
		t.Errorf("a push waiting for a collection said %q (and ended %v), want one notice naming it", heard, err)
	}
}

// A push that found its chunks in the store, unreferenced, keeps a collection from
// removing them before its manifest refers to them; the collection names the push.
func TestCollectRefusesWhileAPushRuns(t *testing.T) {
	ctx := context.Background()
	st := store.NewDir(t.TempDir())
	src := testImage(t, 0)
	if _, _, err := chunked.Push(ctx, st, "job/1", src, chunked.Options{}); err != nil {
		t.Fatal(err)
	}
	if err := st.Delete(ctx, chunked.ManifestKey("job/1")); err != nil { // its chunks stay
		t.Fatal(err)
	}
	// A push held once it found its first chunk present.
	held := &gateStore{Store: st, entered: make(chan struct{}), release: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, _, err := chunked.Push(ctx, held, "job/2", src, chunked.Options{Workers: 1})
		done <- err
	}()
	<-held.entered
	if _, err := chunked.Collect(ctx, st, "job", false); !errors.Is(err, chunked.ErrBusy) || !strings.Contains(err.Error(), "a push by gpucr") {
		t.Errorf("collect during a push = %v, want ErrBusy naming the push", err)
	}
	close(held.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	pullSame(t, st, "job/2", src)
}

// gateStore holds the first chunk lookup, once answered, until release closes.
type gateStore struct {
	store.Store
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (g *gateStore) Stat(ctx context.Context, key string) (int64, error) {
	n, err := g.Store.Stat(ctx, key)
	if strings.Contains(key, "/"+chunked.ChunksDir+"/") {
		g.once.Do(func() { close(g.entered); <-g.release })
	}
	return n, err
}

// A push waits for a live collection, and goes on once the collection's lease is stale (its
// gpucr died).
func TestPushWaitsOutACollection(t *testing.T) {
	chunked.SetLeaseTiming(t.Cleanup, 100*time.Millisecond, time.Second)
	ctx := context.Background()
	st := store.NewDir(t.TempDir())
	key := "job/" + chunked.LeasesDir + "/collect-elsewhere-otherboot-1-1-00"
	stopped := make(chan time.Time, 1)
	go func() { // a collection that stays alive for a while, then dies
		for end := time.Now().Add(1200 * time.Millisecond); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			_ = st.Put(ctx, key, []byte("x"))
		}
		stopped <- time.Now()
	}()
	time.Sleep(200 * time.Millisecond)
	if _, _, err := chunked.Push(ctx, st, "job/1", testImage(t, 0), chunked.Options{}); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-stopped:
		t.Logf("push ended %v after the collection's last sign of life", time.Since(at))
	default:
		t.Fatal("the push ended while a collection was alive")
	}
}

// slowStat answers chunk lookups late, as a distant store does: a push finds a chunk
// present well before its manifest refers to it.
type slowStat struct{ store.Store }

func (s slowStat) Stat(ctx context.Context, key string) (int64, error) {
	n, err := s.Store.Stat(ctx, key)
	if strings.Contains(key, "/"+chunked.ChunksDir+"/") {
		time.Sleep(30 * time.Millisecond)
	}
	return n, err
}

// A lease left by a gpucr of this host that died (kill -9 of a push) holds nothing up:
// its owner is known to be gone. One of another PID namespace on this host (a container's:
// it shares the boot ID) names a PID that means nothing here, and holds a collection up
// until it goes stale: a hostile test's collection took a live push there for dead and
// swept the chunks it was reusing.
func TestLeaseOfADeadGpucrIsIgnored(t *testing.T) {
	ctx := context.Background()
	st := store.NewDir(t.TempDir())
	exited := exec.Command("true")
	if err := exited.Run(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Skip("no boot ID:", err)
	}
	boot := strings.ReplaceAll(strings.TrimSpace(string(b)), "-", "")
	host, scope := chunked.Host(), chunked.Scope()
	self, err := proctree.Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []struct {
		name string
		busy bool
	}{
		{chunked.LeaseName("write", host, scope, exited.Process.Pid, 1), false},
		{chunked.LeaseName("write", host, scope, self.PID, self.Start+1), false}, // its PID reused
		{chunked.LeaseName("write", host, scope, self.PID, self.Start), true},
		{chunked.LeaseName("write", "there", "otherboot.1", exited.Process.Pid, 1), true},
		{chunked.LeaseName("write", host, boot+".1", exited.Process.Pid, 1), true}, // another PID namespace
		{chunked.LeaseName("write", host, boot, exited.Process.Pid, 1), true},      // no PID namespace named
		{chunked.LeaseName("write", "elsewhere", scope, exited.Process.Pid, 1), true},
	} {
		key := "job/" + chunked.LeasesDir + "/" + l.name
		if err := st.Put(ctx, key, []byte("x")); err != nil {
			t.Fatal(err)
		}
		_, err := chunked.Collect(ctx, st, "job", false)
		if busy := errors.Is(err, chunked.ErrBusy); busy != l.busy || err != nil && !busy {
			t.Errorf("collect beside lease %s = %v, want busy %v", l.name, err, l.busy)
		}
		if err := st.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
	}
}

// Pushes that reuse chunks race collections that remove them: whatever the interleaving,
// every checkpoint that exists at the end pulls whole, and a last collection leaves exactly
// the chunks they reference.
func TestPushesRacingCollections(t *testing.T) {
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			st := open(t)
			srcs := []string{testImage(t, 0), testImage(t, 1)}
			const rounds = 4
			var mu sync.Mutex
			pushed := map[string]string{}
			var wg sync.WaitGroup
			for w := range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range rounds {
						// Each new checkpoint holds the same chunks as the one just deleted.
						p := fmt.Sprintf("job/w%d-%d", w, i)
						if _, _, err := chunked.Push(ctx, slowStat{st}, p, srcs[w], chunked.Options{}); err != nil {
							t.Errorf("push %s: %v", p, err)
							return
						}
						mu.Lock()
						pushed[p] = srcs[w]
						mu.Unlock()
						if i%2 == 0 {
							if _, err := chunked.Delete(ctx, st, p); err != nil && !errors.Is(err, chunked.ErrBusy) {
								t.Errorf("delete %s: %v", p, err)
							} else {
								mu.Lock()
								delete(pushed, p)
								mu.Unlock()
							}
						}
					}
				}()
			}
			collecting := make(chan struct{})
			go func() {
				defer close(collecting)
				for pushing := true; pushing; {
					pushing = !done(&wg)
					if _, err := chunked.Collect(ctx, st, "job", false); err != nil && !errors.Is(err, chunked.ErrBusy) {
						t.Errorf("collect: %v", err)
					}
				}
			}()
			<-collecting
			var prefixes []string
			for p, src := range pushed {
				pullSame(t, st, p, src)
				prefixes = append(prefixes, p)
			}
			if _, err := chunked.Collect(ctx, st, "job", false); err != nil {
				t.Fatal(err)
			}
			if got, want := chunkNames(t, st, "job"), referencedBy(t, st, prefixes...); !sameNames(got, want) {
				t.Errorf("after the last collection: %d chunks, %d referenced", len(got), len(want))
			}
		})
	}
}

// done reports whether wg's count is zero, without blocking.
func done(wg *sync.WaitGroup) bool {
	c := make(chan struct{})
	go func() { wg.Wait(); close(c) }()
	select {
	case <-c:
		return true
	case <-time.After(time.Millisecond):
		return false
	}
}

// A collection pointed at a directory that is not a store (its chunks/ holds a file that
// is no chunk) removes nothing and writes nothing there: a hostile test lost a user's
// results.csv to `gpucr gc` of their project directory.
func TestCollectRefusesADirectoryThatIsNoStore(t *testing.T) {
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			st := open(t)
			for _, key := range []string{"mine/chunks/results.csv", "mine/chunks/" + strings.Repeat("a", 64), "mine/notes.txt"} {
				if err := st.Put(ctx, key, []byte("data")); err != nil {
					t.Fatal(err)
				}
			}
			// Without a chunks/ at all: a push's leftovers are looked for in every folder, and
			// a user's photos/.holiday.tmp-jpg went as one (a second hostile test).
			if err := st.Put(ctx, "other/photos/x.jpg", []byte("data")); err != nil {
				t.Fatal(err)
			}
			if c, err := chunked.Collect(ctx, st, "other", false); !errors.Is(err, chunked.ErrNotStore) || !strings.Contains(err.Error(), "has no chunks/") {
				t.Fatalf("collect of a directory without chunks/ = %+v, %v; want ErrNotStore", c, err)
			}
			if es, _ := st.List(ctx, "other"); len(es) != 1 {
				t.Errorf("the refused collection left %v in the directory, want photos/ alone", es)
			}
			for _, dry := range []bool{true, false} {
				if c, err := chunked.Collect(ctx, st, "mine", dry); !errors.Is(err, chunked.ErrNotStore) || !strings.Contains(err.Error(), "results.csv") {
					t.Fatalf("collect (dry run %v) of a directory that is no store = %+v, %v; want ErrNotStore naming results.csv", dry, c, err)
				}
			}
			if names := chunkNames(t, st, "mine"); len(names) != 2 {
				t.Errorf("chunks/ after the refused collection: %q, want both files kept", names)
			}
			es, err := st.List(ctx, "mine")
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range es {
				if e.Name() != chunked.ChunksDir && e.Name() != "notes.txt" {
					t.Errorf("the refused collection wrote %s", e.Key)
				}
			}
		})
	}
}

// A checkpoint put in a directory named chunks before it held chunks, which later became a
// store's chunks/, no longer blocks that store's collections: directories in chunks/ are
// passed over and never removed, and both checkpoints pull whole after a gc and an rm
// (hostile test: every gc and rm of the store refused from then on).
func TestCollectPassesOverADirectoryInChunks(t *testing.T) {
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			st := open(t)
			src, other := testImage(t, 0), testImage(t, 1)
			if _, _, err := chunked.Push(ctx, st, "a/"+chunked.ChunksDir+"/ck", src, chunked.Options{}); err != nil {
				t.Fatal(err) // nothing there yet: a directory like any other
			}
			if _, _, err := chunked.Push(ctx, st, "a/x", other, chunked.Options{}); err != nil {
				t.Fatal(err)
			}
			if _, err := chunked.Collect(ctx, st, "a", false); err != nil {
				t.Fatalf("gc of the store: %v", err)
			}
			pullSame(t, st, "a/x", other)
			if _, err := chunked.Delete(ctx, st, "a/x"); err != nil {
				t.Fatalf("rm of the store's checkpoint: %v", err)
			}
			es, err := st.List(ctx, "a/"+chunked.ChunksDir)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range es {
				if !e.Dir {
					t.Errorf("a chunk of the removed checkpoint left: %s", e.Key)
				}
			}
			pullSame(t, st, "a/"+chunked.ChunksDir+"/ck", src)
		})
	}
}

// A collection in a shared store directory whose chunks/ another user replaced with a
// symlink to a store of someone else's removes nothing there (a hostile test emptied
// another store so, as root, with gpucr gc and gpucr rm).
func TestCollectFollowsNoSymlink(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	st := store.NewDir(root)
	if _, _, err := chunked.Push(ctx, st, "private/job", testImage(t, 0), chunked.Options{}); err != nil {
		t.Fatal(err)
	}
	before := chunkNames(t, st, "private")
	if _, _, err := chunked.Push(ctx, st, "shared/job", testImage(t, 1), chunked.Options{}); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(root, "shared", chunked.ChunksDir)); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "private", chunked.ChunksDir), filepath.Join(root, "shared", chunked.ChunksDir)); err != nil {
		t.Fatal(err)
	}
	if c, err := chunked.Collect(ctx, st, "shared", false); err == nil {
		t.Errorf("gc of a store whose chunks/ is a symlink: %+v", c)
	}
	if _, err := chunked.Delete(ctx, st, "shared/job"); err == nil {
		t.Error("rm in a store whose chunks/ is a symlink succeeded")
	}
	if after := chunkNames(t, st, "private"); len(after) != len(before) {
		t.Fatalf("the other store's chunks: %d, were %d", len(after), len(before))
	}
	if _, _, err := chunked.Pull(ctx, st, "private/job", filepath.Join(t.TempDir(), "img"), chunked.Options{}); err != nil {
		t.Fatalf("the other store's checkpoint no longer pulls: %v", err)
	}
}

// A lease dated far ahead (whoever can write the directory can set a file's time) does not
// hold collections up for ever: it was not written on the store's clock by a live holder.
func TestLeaseFromTheFutureIsIgnored(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	st := store.NewDir(root)
	if err := st.Put(ctx, "job/"+chunked.ChunksDir+"/"+strings.Repeat("a", 64), []byte("x")); err != nil {
		t.Fatal(err)
	}
	key := "job/" + chunked.LeasesDir + "/write-there-otherboot-1-1-00"
	if err := st.Put(ctx, key, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := chunked.Collect(ctx, st, "job", false); !errors.Is(err, chunked.ErrBusy) {
		t.Fatalf("collect beside a fresh lease = %v, want busy", err)
	}
	future := time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := os.Chtimes(filepath.Join(root, filepath.FromSlash(key)), future, future); err != nil {
		t.Fatal(err)
	}
	if _, err := chunked.Collect(ctx, st, "job", false); err != nil {
		t.Errorf("collect beside a lease dated %v = %v", future, err)
	}
}

// What a killed write left in a local store — a chunk's or a manifest object's temporary
// file — is collected; a file of the same shape that no write of a checkpoint makes stays,
// in whatever folder of the store directory it is (a hostile test's rm of /home/x swept
// every home's .NAME.tmp-* files).
func TestCollectRemovesOnlyWhatKilledWritesLeft(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	st := store.NewDir(root)
	if _, _, err := chunked.Push(ctx, st, "home/x", testImage(t, 0), chunked.Options{}); err != nil {
		t.Fatal(err)
	}
	litter := []string{
		"home/chunks/." + strings.Repeat("ab", 32) + ".tmp-123",
		"home/y/." + chunked.ManifestObject + ".tmp-456",
	}
	kept := []string{"home/bob/.notes.tmp-1", "home/y/.draft.tmp-2", "home/chunks/.abc.tmp-3"}
	for _, p := range append(slices.Clone(litter), kept...) {
		testutil.WriteFile(t, filepath.Join(root, p), []byte("data"))
	}
	if _, err := chunked.Delete(ctx, st, "home/x"); err != nil {
		t.Fatal(err)
	}
	for _, p := range litter {
		if _, err := os.Stat(filepath.Join(root, p)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s is left: %v", p, err)
		}
	}
	for _, p := range kept {
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("%s was removed: %v", p, err)
		}
	}
}

// A collection run by root trusts a local store's listing only where no user can rename
// what it lists: a user who owned the store directory renamed root's checkpoint to
// .gpucr-leases, which a collection skips, and root's gc removed its chunks (hostile test).
// A checkpoint's own directory and chunks/ count as much as the store's.
func TestCollectByRootTrustsOnlyWhatUsersCannotRename(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the store is given to another user")
	}
	ctx := context.Background()
	for _, given := range []string{"", chunked.ChunksDir, "rootjob", "otherjob"} {
		t.Run("user owns "+path.Join("store", given), func(t *testing.T) {
			root := t.TempDir()
			st := store.NewDir(root)
			src := testImage(t, 0)
			for _, job := range []string{"store/rootjob", "store/otherjob"} {
				if _, _, err := chunked.Push(ctx, st, job, src, chunked.Options{}); err != nil {
					t.Fatal(err)
				}
			}
			before := chunkNames(t, st, "store")
			if err := os.Chown(filepath.Join(root, "store", given), 65534, 65534); err != nil {
				t.Fatal(err)
			}
			if c, err := chunked.Collect(ctx, st, "store", false); !errors.Is(err, chunked.ErrUntrusted) {
				t.Fatalf("root's gc of a store a user can rename in = %+v, %v; want ErrUntrusted", c, err)
			}
			if _, err := chunked.Delete(ctx, st, "store/rootjob"); err == nil {
				t.Error("root's rm in a store a user can rename in succeeded")
			}
			if after := chunkNames(t, st, "store"); len(after) != len(before) {
				t.Fatalf("chunks after the refused collection: %d, were %d", len(after), len(before))
			}
			pullSame(t, st, "store/rootjob", src)
		})
	}
}

// A checkpoint named like a write in progress (.NAME.tmp-X) is a checkpoint all the same:
// a local store's listing hid it, and a collection took its chunks for unreferenced.
func TestCollectKeepsACheckpointNamedLikeATemporaryFile(t *testing.T) {
	ctx := context.Background()
	st := store.NewDir(t.TempDir())
	src := testImage(t, 0)
	if _, _, err := chunked.Push(ctx, st, "jobs/.nightly.tmp-2026", src, chunked.Options{}); err != nil {
		t.Fatal(err)
	}
	c, err := chunked.Collect(ctx, st, "jobs", false)
	if err != nil || c.Removed != 0 || c.Checkpoints != 1 {
		t.Fatalf("collect = %+v, %v; want the checkpoint found and nothing removed", c, err)
	}
	pullSame(t, st, "jobs/.nightly.tmp-2026", src)
}

// fill writes into dir until its file system is full.
func fill(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 64<<10)
	for {
		if _, err := f.Write(b); errors.Is(err, syscall.ENOSPC) {
			return
		} else if err != nil {
			t.Fatal(err)
		}
	}
}

// A full store can be cleaned: a dry run takes no lease and counts, and a local store's
// collection takes its empty lease and removes what nothing references. A store that
// refuses even that says so, and removes nothing. The full stores of a hostile test
// refused every gc, each writing its lease first.
func TestCollectOnAFullStore(t *testing.T) {
	ctx := context.Background()
	unreferenced := func(t *testing.T, st store.Store) {
		t.Helper()
		for i := range 3 {
			if err := st.Put(ctx, "job/"+chunked.ChunksDir+"/"+strings.Repeat(fmt.Sprint(i), 64), make([]byte, 256<<10)); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Run("dir", func(t *testing.T) {
		root := testutil.SmallTmpfs(t, "4m")
		st := store.NewDir(root)
		unreferenced(t, st)
		fill(t, root)
		if c, err := chunked.Collect(ctx, st, "job", true); err != nil || c.Removed != 3 {
			t.Fatalf("dry run on a full store = %+v, %v; want 3 chunks counted", c, err)
		}
		if c, err := chunked.Collect(ctx, st, "job", false); err != nil || c.Removed != 3 {
			t.Fatalf("collect on a full store = %+v, %v; want 3 chunks removed", c, err)
		}
	})
	// The server's drive, mounted before the subtest makes its first temporary directory.
	drive := testutil.SmallTmpfs(t, "150m")
	t.Run("s3", func(t *testing.T) {
		t.Setenv("TMPDIR", drive)
		st := storetest.Start(t).Store(t)
		unreferenced(t, st)
		// Filled with ever smaller objects, as a push fills it: then it refuses every write.
		var stored int
		for size := 4 << 20; size >= 1<<10; size /= 4 {
			for i := 0; st.Put(ctx, fmt.Sprintf("other/%d-%d", size, i), make([]byte, size)) == nil; i++ {
				if stored += size; stored > 150<<20 {
					t.Fatal("150 MiB stored and the server is not full: its data is not on the small drive")
				}
			}
		}
		if c, err := chunked.Collect(ctx, st, "job", true); err != nil || c.Removed != 3 {
			t.Fatalf("dry run on a full store = %+v, %v; want 3 chunks counted", c, err)
		}
		_, err := chunked.Collect(ctx, st, "job", false)
		if !store.Full(err) || !strings.Contains(err.Error(), "make room") {
			t.Fatalf("collect on a store too full for its lease = %v, want it to say so", err)
		}
		if got := chunkNames(t, st, "job"); len(got) != 3 {
			t.Errorf("chunks left = %v, want all 3", got)
		}
	})
}

// A checkpoint moved elsewhere and put back as a symbolic link, or whose manifest object is
// one, is no interrupted push: the collection removes nothing, where it took such a
// checkpoint's chunks for unreferenced and removed them (hostile test).
func TestCollectRemovesNothingBesideACheckpointBehindASymlink(t *testing.T) {
	for _, linked := range []string{"checkpoint", "manifest"} {
		t.Run(linked, func(t *testing.T) {
			ctx := context.Background()
			root, elsewhere := t.TempDir(), t.TempDir()
			st := store.NewDir(root)
			if _, _, err := chunked.Push(ctx, st, "job/1", testImage(t, 0), chunked.Options{}); err != nil {
				t.Fatal(err)
			}
			from, to := filepath.Join(root, "job", "1"), filepath.Join(elsewhere, "1")
			if linked == "manifest" {
				from, to = filepath.Join(from, chunked.ManifestObject), filepath.Join(elsewhere, chunked.ManifestObject)
			}
			if err := os.Rename(from, to); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(to, from); err != nil {
				t.Fatal(err)
			}
			before := chunkNames(t, st, "job")
			for _, dry := range []bool{true, false} {
				if c, err := chunked.Collect(ctx, st, "job", dry); err == nil {
					t.Fatalf("collect (dry run %v) = %+v, want a refusal", dry, c)
				}
			}
			if after := chunkNames(t, st, "job"); !sameNames(before, after) {
				t.Fatalf("chunks removed: %d of %d left", len(after), len(before))
			}
		})
	}
}
