package chunked_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/internal/diskroom"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/store"
	"github.com/gpucr/gpucr/internal/store/chunked"
	"github.com/gpucr/gpucr/internal/store/storetest"
	"github.com/gpucr/gpucr/internal/testutil"
)

const (
	mib   = 1 << 20
	chunk = chunked.ChunkSize
)

// random returns n reproducible pseudo-random bytes: incompressible, like most of a
// process's memory.
func random(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// testImage commits an image whose page file has, in chunks: random data, two zero chunks,
// a repeat of the first chunk, random data (changed by variant), text, and a short tail.
func testImage(t *testing.T, variant uint64) string {
	t.Helper()
	first := random(1, chunk)
	pages := bytes.Join([][]byte{first, make([]byte, 2*chunk), first, random(2+variant, chunk),
		bytes.Repeat([]byte("compressible page text "), chunk/23+1)[:chunk], random(3, 1234)}, nil)
	dir := filepath.Join(t.TempDir(), "img")
	s, err := image.Begin(dir)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{
		"criu/pages-1.img":   pages,
		"criu/pagemap-1.img": []byte("pagemap"),
		"criu/empty.img":     nil,
		"logs/dump.log":      []byte("dump log\n"),
	}
	for p, b := range files {
		if err := os.WriteFile(filepath.Join(s.Dir(), p), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	m := &image.Manifest{GpucrVersion: "test", Created: time.Now().UTC(), RootPID: 42, MemoryBytes: uint64(len(pages)),
		Host: image.HostInfo{Hostname: "h"}, Processes: []image.Process{{PID: 42, PPID: 1, Command: "counter", Threads: 1}}}
	if err := s.Commit(m); err != nil {
		t.Fatal(err)
	}
	// The zero chunks are a hole, as in the memory gpucr saves: a push takes them as zeros
	// without reading them, and the file reads the same.
	f, err := os.OpenFile(filepath.Join(dir, "criu/pages-1.img"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, chunk, 2*chunk); err != nil {
		t.Fatal(err)
	}
	return dir
}

// sameTree fails unless every file under want is under got with the same bytes and got
// has nothing more.
func sameTree(t *testing.T, want, got string) {
	t.Helper()
	seen := 0
	err := filepath.WalkDir(want, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(want, p)
		a, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(filepath.Join(got, rel))
		if err != nil {
			t.Errorf("%s: %v", rel, err)
			return nil
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs after the round trip (%d bytes, want %d)", rel, len(b), len(a))
		}
		seen++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	err = filepath.WalkDir(got, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			n++
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if n != seen {
		t.Errorf("pulled %d files, want %d", n, seen)
	}
}

// stores are the backends every test runs on.
// put stores b under key, failing the test if it cannot.
func put(t *testing.T, st store.Store, key string, b []byte) {
	t.Helper()
	if err := st.Put(context.Background(), key, b); err != nil {
		t.Fatal(err)
	}
}

func stores(t *testing.T) map[string]func(t *testing.T) store.Store {
	var srv *storetest.Server
	return map[string]func(t *testing.T) store.Store{
		"dir": func(t *testing.T) store.Store { return store.NewDir(t.TempDir()) },
		"s3": func(t *testing.T) store.Store {
			if srv == nil {
				srv = storetest.Start(t)
			}
			return srv.Store(t)
		},
	}
}

func TestRoundTrip(t *testing.T) {
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			st := open(t)
			src := testImage(t, 0)
			var last atomic.Int64
			m, stats, err := chunked.Push(ctx, st, "jobs/ckpt-1", src, chunked.Options{Progress: func(done, total int64) { last.Store(done) }})
			if err != nil {
				t.Fatal(err)
			}
			// pages: 7 chunks, 2 zero, one repeat; plus 5 small files, the manifest's seal
			// among them (empty.img has none).
			if stats.ZeroBytes != 2*chunk || stats.Chunks != 9 || stats.Transferred != 8 || stats.Files != 6 {
				t.Errorf("push stats = %+v", stats)
			}
			if last.Load() != stats.Bytes {
				t.Errorf("progress ended at %d of %d", last.Load(), stats.Bytes)
			}
			if stats.WireBytes >= stats.TransferredBytes {
				t.Errorf("nothing compressed: %d bytes for %d", stats.WireBytes, stats.TransferredBytes)
			}
			if m.Image.RootPID != 42 || m.StoredBytes() != stats.WireBytes {
				t.Errorf("manifest: root %d stored %d", m.Image.RootPID, m.StoredBytes())
			}

			dst := filepath.Join(t.TempDir(), "pulled")
			im, pstats, err := chunked.Pull(ctx, st, "jobs/ckpt-1", dst, chunked.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if im.RootPID != 42 || pstats.ZeroBytes != 2*chunk || pstats.Bytes != stats.Bytes {
				t.Errorf("pull: root %d stats %+v", im.RootPID, pstats)
			}
			sameTree(t, src, dst)
			if entries, _ := os.ReadDir(filepath.Dir(dst)); len(entries) != 1 {
				t.Errorf("pull left %d entries beside the image", len(entries))
			}

			// Pulling into an empty directory works; into a full one is refused up front.
			empty := filepath.Join(t.TempDir(), "empty")
			if err := os.Mkdir(empty, 0o755); err != nil {
				t.Fatal(err)
			}
			if _, _, err := chunked.Pull(ctx, st, "jobs/ckpt-1", empty, chunked.Options{}); err != nil {
				t.Fatal(err)
			}
			// Each refusal says what to do, not only what is wrong.
			if _, _, err := chunked.Pull(ctx, st, "jobs/ckpt-1", dst, chunked.Options{}); !errors.Is(err, chunked.ErrNotEmpty) || !strings.Contains(fmt.Sprint(err), "give a new or empty directory") {
				t.Errorf("pull over an image = %v, want ErrNotEmpty saying what to do", err)
			}
			if _, _, err := chunked.Push(ctx, st, "jobs/ckpt-1", src, chunked.Options{}); !errors.Is(err, chunked.ErrExists) || !strings.Contains(fmt.Sprint(err), "gpucr rm") {
				t.Errorf("second push to one prefix = %v, want ErrExists saying what to do", err)
			}
		})
	}
}

// A second checkpoint beside the first uploads only what changed.
func TestSecondCheckpointDedups(t *testing.T) {
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			st := open(t)
			if _, _, err := chunked.Push(ctx, st, "job/1", testImage(t, 0), chunked.Options{}); err != nil {
				t.Fatal(err)
			}
			second := testImage(t, 1)
			_, stats, err := chunked.Push(ctx, st, "job/2", second, chunked.Options{})
			if err != nil {
				t.Fatal(err)
			}
			// The changed chunk, manifest.json (its checksums changed) and its seal are new.
			if stats.Transferred != 3 || stats.Present != 5 {
				t.Errorf("second push: %+v", stats)
			}
			dst := filepath.Join(t.TempDir(), "img")
			if _, _, err := chunked.Pull(ctx, st, "job/2", dst, chunked.Options{}); err != nil {
				t.Fatal(err)
			}
			sameTree(t, second, dst)
		})
	}
}

// An interrupted push leaves nothing that lists or pulls, and a retry finishes it,
// skipping the chunks already uploaded.
func TestInterruptedPush(t *testing.T) {
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			st := open(t)
			src := testImage(t, 0)
			broken := &cutStore{Store: st, after: 3}
			if _, _, err := chunked.Push(ctx, broken, "job/ckpt", src, chunked.Options{Workers: 1}); err == nil ||
				!strings.Contains(err.Error(), "connection cut") {
				t.Fatalf("push through a cut store = %v", err)
			}
			assertAbsent(t, st, "job", "job/ckpt")

			// Cancelled part-way (Ctrl-C): the same.
			cctx, cancel := context.WithCancel(ctx)
			cancelling := &cutStore{Store: st, after: 1, cancel: cancel}
			if _, _, err := chunked.Push(cctx, cancelling, "job/ckpt", src, chunked.Options{}); !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled push = %v", err)
			}
			assertAbsent(t, st, "job", "job/ckpt")

			_, stats, err := chunked.Push(ctx, st, "job/ckpt", src, chunked.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if stats.Present < 3 || stats.Present+stats.Transferred != 8 {
				t.Errorf("retry did not reuse the uploaded chunks: %+v", stats)
			}
			dst := filepath.Join(t.TempDir(), "img")
			if _, _, err := chunked.Pull(ctx, st, "job/ckpt", dst, chunked.Options{}); err != nil {
				t.Fatal(err)
			}
			sameTree(t, src, dst)
		})
	}
}

// cutStore lets `after` chunk uploads through and fails the rest, as a dropped connection
// does; with cancel set it cancels the push instead.
type cutStore struct {
	store.Store
	after  int64
	puts   atomic.Int64
	cancel context.CancelFunc
}

func (c *cutStore) Put(ctx context.Context, key string, data []byte) error {
	if strings.Contains(key, "/"+chunked.ChunksDir+"/") && c.puts.Add(1) > c.after {
		if c.cancel != nil {
			c.cancel()
			return ctx.Err()
		}
		return errors.New("connection cut")
	}
	return c.Store.Put(ctx, key, data)
}

// stallingStore's chunk downloads stall midway (store.ErrStalled) the first stalls times
// each chunk is asked for.
type stallingStore struct {
	store.Store
	stalls int
	mu     sync.Mutex
	asked  map[string]int
}

func (s *stallingStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	r, err := s.Store.Get(ctx, key)
	if err != nil || path.Base(path.Dir(key)) != chunked.ChunksDir {
		return r, err
	}
	s.mu.Lock()
	s.asked[key]++
	stall := s.asked[key] <= s.stalls
	s.mu.Unlock()
	if !stall {
		return r, nil
	}
	return struct {
		io.Reader
		io.Closer
	}{io.MultiReader(io.LimitReader(r, 100), iotest.ErrReader(fmt.Errorf("read: %w", store.ErrStalled))), r}, nil
}

// A chunk whose download stalls once is fetched again, and the pull is whole; one that
// stalls every time fails the pull with the stall, after a second try.
func TestPullTriesAStalledChunkAgain(t *testing.T) {
	ctx := context.Background()
	src := testImage(t, 0)
	dir := t.TempDir()
	if _, _, err := chunked.Push(ctx, store.NewDir(dir), "x", src, chunked.Options{}); err != nil {
		t.Fatal(err)
	}
	once := &stallingStore{Store: store.NewDir(dir), stalls: 1, asked: map[string]int{}}
	if _, _, err := chunked.Pull(ctx, once, "x", filepath.Join(t.TempDir(), "img"), chunked.Options{}); err != nil {
		t.Fatalf("pull with each chunk stalling once: %v", err)
	}
	always := &stallingStore{Store: store.NewDir(dir), stalls: 1 << 30, asked: map[string]int{}}
	_, _, err := chunked.Pull(ctx, always, "x", filepath.Join(t.TempDir(), "img"), chunked.Options{})
	if !errors.Is(err, store.ErrStalled) {
		t.Fatalf("pull with every download stalling: %v, want the stall", err)
	}
	if len(always.asked) == 0 || len(once.asked) == 0 {
		t.Fatal("no chunk was asked for")
	}
	// The first chunk to fail stops the others, which may have been asked for once.
	if most := slices.Max(slices.Collect(maps.Values(always.asked))); most != 2 {
		t.Errorf("a stalling chunk asked for %d times at most, want 2", most)
	}
}

// assertAbsent checks that no checkpoint is at prefix by every way of looking.
func assertAbsent(t *testing.T, st store.Store, dir, prefix string) {
	t.Helper()
	ctx := context.Background()
	if ls, err := chunked.List(ctx, st, dir); err != nil || len(ls) != 0 {
		t.Errorf("List(%s) = %+v, %v after a failed push", dir, ls, err)
	}
	if _, err := chunked.Load(ctx, st, prefix); !errors.Is(err, chunked.ErrNoCheckpoint) {
		t.Errorf("Load = %v, want ErrNoCheckpoint", err)
	}
	dst := filepath.Join(t.TempDir(), "img")
	if _, _, err := chunked.Pull(ctx, st, prefix, dst, chunked.Options{}); !errors.Is(err, chunked.ErrNoCheckpoint) {
		t.Errorf("Pull = %v, want ErrNoCheckpoint", err)
	}
	if _, err := os.Stat(dst); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused pull created %s", dst)
	}
}

// A damaged or missing chunk fails the pull, naming the chunk and its file, and leaves
// nothing at the destination.
func TestPullDetectsBadChunks(t *testing.T) {
	enc, _ := zstd.NewWriter(nil)
	tests := []struct {
		name   string
		damage func(ctx context.Context, st store.Store, key string) error
		reason string
	}{
		{"missing", func(ctx context.Context, st store.Store, key string) error { return st.Delete(ctx, key) }, "missing"},
		{"other content", func(ctx context.Context, st store.Store, key string) error {
			b := enc.EncodeAll(random(99, chunk), nil)
			return st.Put(ctx, key, b)
		}, "corrupted: its bytes do not match"},
		{"a byte of a raw block changed", func(ctx context.Context, st store.Store, key string) error {
			// Stored raw (random data), its blocks are used where they arrive, undecoded.
			r, err := st.Get(ctx, key)
			if err != nil {
				return err
			}
			b, err := io.ReadAll(r)
			r.Close()
			if err != nil || len(b) < chunk || b[4] != 0xA0 {
				return fmt.Errorf("the chunk is not stored as a raw frame (%d bytes, %v): the case would test nothing", len(b), err)
			}
			b[len(b)/2] ^= 1
			return st.Put(ctx, key, b)
		}, "corrupted: its bytes do not match"},
		{"garbage", func(ctx context.Context, st store.Store, key string) error {
			return st.Put(ctx, key, []byte("not zstd at all"))
		}, "corrupted: "},
		{"truncated", func(ctx context.Context, st store.Store, key string) error {
			b := enc.EncodeAll(random(2, chunk), nil)[:1000]
			return st.Put(ctx, key, b)
		}, "corrupted: "},
	}
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			st := open(t)
			m, _, err := chunked.Push(ctx, st, "ckpt", testImage(t, 0), chunked.Options{})
			if err != nil {
				t.Fatal(err)
			}
			var victim chunked.Chunk
			for _, f := range m.Files {
				if f.Path == "criu/pages-1.img" {
					victim = f.Chunks[4] // random(2), stored raw
				}
			}
			key := chunked.ChunkKey("ckpt", victim.SHA256)
			good, err := st.Get(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			var saved bytes.Buffer
			_, err = saved.ReadFrom(good)
			good.Close()
			if err != nil {
				t.Fatal(err)
			}
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					if err := tt.damage(ctx, st, key); err != nil {
						t.Fatal(err)
					}
					defer put(t, st, key, saved.Bytes())
					parent := t.TempDir()
					_, _, err := chunked.Pull(ctx, st, "ckpt", filepath.Join(parent, "img"), chunked.Options{})
					var ce *chunked.ChunkError
					if !errors.As(err, &ce) || !errors.Is(err, chunked.ErrBadChunk) {
						t.Fatalf("Pull = %v, want a ChunkError", err)
					}
					want := "chunk " + st.URL(key) + " (criu/pages-1.img at offset " + strconv.Itoa(4*chunk) + "): " + tt.reason
					if !strings.HasPrefix(err.Error(), want) {
						t.Errorf("error %q\ndoes not start %q", err, want)
					}
					if entries, _ := os.ReadDir(parent); len(entries) != 0 {
						t.Errorf("a failed pull left %d entries", len(entries))
					}
				})
			}
		})
	}
}

// A chunk is checked against its xxh64; a manifest object written before chunks had one
// (its chunks named by sha256 only) is checked against the sha256, so other content is
// refused either way.
func TestPullChecksSHA256WhereNoXXH64(t *testing.T) {
	ctx := context.Background()
	st := store.NewDir(t.TempDir())
	m, _, err := chunked.Push(ctx, st, "ckpt", testImage(t, 0), chunked.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var victim chunked.Chunk
	for i, f := range m.Files {
		for j, c := range f.Chunks {
			if !c.Zero && len(c.XXH64) != 16 {
				t.Fatalf("%s chunk %d has no xxh64: %+v", f.Path, j, c)
			}
			m.Files[i].Chunks[j].XXH64 = ""
		}
		if f.Path == "criu/pages-1.img" {
			victim = f.Chunks[4]
		}
	}
	raw, _ := json.Marshal(m)
	put(t, st, chunked.ManifestKey("ckpt"), raw)
	enc, _ := zstd.NewWriter(nil)
	put(t, st, chunked.ChunkKey("ckpt", victim.SHA256), enc.EncodeAll(random(99, int(victim.Size)), nil))
	_, _, err = chunked.Pull(ctx, st, "ckpt", filepath.Join(t.TempDir(), "img"), chunked.Options{})
	if !errors.Is(err, chunked.ErrBadChunk) || !strings.Contains(err.Error(), "corrupted") {
		t.Fatalf("Pull of other content under an old manifest object = %v, want a bad chunk", err)
	}
}

func TestPushRefusesDamagedImage(t *testing.T) {
	src := testImage(t, 0)
	if err := os.WriteFile(filepath.Join(src, "criu/pagemap-1.img"), []byte("PAGEMAP"), 0o600); err != nil {
		t.Fatal(err)
	}
	st := store.NewDir(t.TempDir())
	_, _, err := chunked.Push(context.Background(), st, "x", src, chunked.Options{})
	if !errors.Is(err, image.ErrCorrupt) || !strings.Contains(err.Error(), "criu/pagemap-1.img") {
		t.Fatalf("Push = %v, want the damaged file named", err)
	}
	if entries, _ := st.List(context.Background(), ""); len(entries) != 0 {
		t.Errorf("a refused push stored %+v", entries)
	}
}

// An image a pull would refuse (more CRIU logs than a stored checkpoint may hold) is refused
// by the push, before anything is stored (review).
func TestPushRefusesWhatAPullWouldRefuse(t *testing.T) {
	src := testImage(t, 0)
	for i := range 257 {
		if err := os.WriteFile(filepath.Join(src, "logs", fmt.Sprintf("l%d.log", i)), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	st := store.NewDir(t.TempDir())
	_, _, err := chunked.Push(context.Background(), st, "x", src, chunked.Options{})
	if err == nil || !strings.Contains(err.Error(), "of CRIU's logs a stored checkpoint may hold") {
		t.Fatalf("Push of an image with 257 logs = %v, want it refused", err)
	}
	if entries, _ := st.List(context.Background(), ""); len(entries) != 0 {
		t.Errorf("a refused push stored %+v", entries)
	}
}

// A push stores what it verified or nothing: a file of the image written while the push
// reads it fails the push, and no checkpoint lists (a hostile test had pushes report
// checkpoints that never pulled back while a file was swapped under them). The logs, which
// no manifest lists, may change.
func TestPushOfAnImageWrittenMeanwhileFails(t *testing.T) {
	for _, file := range []string{"criu/pages-1.img", "logs/dump.log"} {
		t.Run(file, func(t *testing.T) {
			src := testImage(t, 0)
			st := store.NewDir(t.TempDir())
			var once sync.Once
			write := func(int64, int64) {
				once.Do(func() {
					f, err := os.OpenFile(filepath.Join(src, file), os.O_WRONLY, 0)
					if err != nil {
						t.Error(err)
						return
					}
					defer f.Close()
					if _, err := f.WriteAt([]byte("changed"), 0); err != nil {
						t.Error(err)
					}
				})
			}
			_, _, err := chunked.Push(context.Background(), st, "x", src, chunked.Options{Progress: write})
			if file == "logs/dump.log" {
				if err != nil {
					t.Fatalf("a push whose log changed: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "changed while it was pushed") || strings.Count(err.Error(), "push /") != 1 {
				t.Fatalf("a push of an image written meanwhile: %v", err)
			}
			if list, err := chunked.List(context.Background(), st, ""); err != nil || len(list) != 0 {
				t.Errorf("listed after the refused push: %+v, %v", list, err)
			}
		})
	}
}

// A push or stream whose lease cannot be written (the leases directory is a file, the store
// is full, the push was interrupted as it began) fails with the store's error: it panicked
// releasing the lease it never had (hostile test).
func TestPushWithoutItsLeaseFailsCleanly(t *testing.T) {
	src := testImage(t, 0)
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, chunked.LeasesDir), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	st := store.NewDir(root)
	if _, _, err := chunked.Push(context.Background(), st, "x", src, chunked.Options{}); err == nil {
		t.Fatal("a push stored a checkpoint without its lease")
	}
	if _, err := chunked.NewStream(context.Background(), st, "y", chunked.Options{}); err == nil {
		t.Fatal("a stream began without its lease")
	}
}

// A checkpoint can neither be named after what a store directory's checkpoints share nor
// live in a store's chunks directory or under a leases directory: one in a store's chunks/
// made it hold what is no chunk, and every gc and rm there refused to run from then on
// (hostile test). A directory of the user's that is named chunks and holds no chunk is
// like any other.
func TestCheckpointsCannotLiveWhereSharedThingsAre(t *testing.T) {
	ctx := context.Background()
	src := testImage(t, 0)
	st := store.NewDir(t.TempDir())
	if _, _, err := chunked.Push(ctx, st, "jobs/real", src, chunked.Options{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{chunked.ChunksDir, "jobs/" + chunked.ChunksDir, "jobs/" + chunked.ChunksDir + "/sub",
		"jobs/" + chunked.ChunksDir + "/team/sub", chunked.LeasesDir + "/write-x", "a/" + chunked.LeasesDir + "/b"} {
		if _, _, err := chunked.Push(ctx, st, name, src, chunked.Options{}); !errors.Is(err, chunked.ErrBadName) {
			t.Errorf("push to %q: %v, want it refused for where it is", name, err)
		}
	}
	if _, err := chunked.Collect(ctx, st, "jobs", false); err != nil {
		t.Errorf("gc after the refused pushes: %v", err)
	}
	if _, _, err := chunked.Push(ctx, st, "data/"+chunked.ChunksDir+"/job", src, chunked.Options{}); err != nil {
		t.Errorf("push into a directory of the user's named chunks: %v", err)
	}
}

// A pull into a mount point or through a symlink is refused before anything is fetched:
// the rename that puts the image in place cannot happen there, and a pull fetched and
// verified everything before it failed on "device or resource busy" (hostile test).
func TestPullRefusesAPlaceTheImageCannotTake(t *testing.T) {
	ctx := context.Background()
	st := store.NewDir(t.TempDir())
	if _, _, err := chunked.Push(ctx, st, "x", testImage(t, 0), chunked.Options{}); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(t.TempDir(), link); err != nil {
		t.Fatal(err)
	}
	for what, dir := range map[string]string{"a mount point": testutil.SmallTmpfs(t, "1m"), "a symlink": link} {
		var fetched int64
		_, _, err := chunked.Pull(ctx, st, "x", dir, chunked.Options{Progress: func(done, _ int64) { fetched = done }})
		if !errors.Is(err, image.ErrNotAPlace) || !strings.Contains(err.Error(), "is "+what) || fetched != 0 {
			t.Errorf("pull into %s: %v after %d bytes, want it refused first as %s", dir, err, fetched, what)
		}
	}
}

// A pull into a directory whose parent is missing is refused as checkpoint -D refuses one,
// naming the parent and what to do, before anything is fetched.
func TestPullRefusesAMissingParentAsCheckpointDoes(t *testing.T) {
	ctx := context.Background()
	st := store.NewDir(t.TempDir())
	if _, _, err := chunked.Push(ctx, st, "x", testImage(t, 0), chunked.Options{}); err != nil {
		t.Fatal(err)
	}
	parent := filepath.Join(t.TempDir(), "nope")
	var fetched int64
	_, _, err := chunked.Pull(ctx, st, "x", filepath.Join(parent, "img"), chunked.Options{Progress: func(done, _ int64) { fetched = done }})
	if !errors.Is(err, image.ErrParentMissing) || !strings.Contains(err.Error(), parent+" of image directory") || !strings.Contains(err.Error(), "create it") || fetched != 0 {
		t.Errorf("pull under a missing parent: %v after %d bytes, want image.ErrParentMissing naming %s and what to do", err, fetched, parent)
	}
}

// A push of an image missing a file it lists says so as the image's own check does, though
// the push opens the files before it verifies them (review).
func TestPushNamesAMissingFile(t *testing.T) {
	src := testImage(t, 0)
	if err := os.Remove(filepath.Join(src, "criu/pagemap-1.img")); err != nil {
		t.Fatal(err)
	}
	_, _, err := chunked.Push(context.Background(), store.NewDir(t.TempDir()), "x", src, chunked.Options{})
	if !errors.Is(err, image.ErrCorrupt) || !strings.Contains(err.Error(), "criu/pagemap-1.img: missing") {
		t.Fatalf("Push = %v, want the missing file named as the image's check does", err)
	}
}

func TestList(t *testing.T) {
	ctx := context.Background()
	st := store.NewDir(t.TempDir())
	src := testImage(t, 0)
	for _, p := range []string{"runs/a", "runs/b"} {
		if _, _, err := chunked.Push(ctx, st, p, src, chunked.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	// Not checkpoints: a prefix with only data, and a damaged manifest, which is shown.
	put(t, st, "runs/other/file", []byte("x"))
	put(t, st, "runs/broken/"+chunked.ManifestObject, []byte("{"))

	ls, err := chunked.List(ctx, st, "runs")
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 3 || ls[0].Prefix != "runs/a" || ls[1].Prefix != "runs/b" || ls[2].Prefix != "runs/broken" ||
		ls[0].Manifest == nil || ls[2].Manifest != nil || !strings.Contains(ls[2].Problem, "invalid checkpoint manifest") {
		t.Fatalf("List = %+v", ls)
	}
	if ls, err := chunked.List(ctx, st, "runs/a"); err != nil || len(ls) != 1 || ls[0].Manifest.Image.RootPID != 42 {
		t.Errorf("List of a checkpoint itself = %+v, %v", ls, err)
	}
	if ls, err := chunked.List(ctx, st, ""); err != nil || len(ls) != 0 {
		t.Errorf("List of the top = %+v, %v", ls, err)
	}
	if _, _, err := chunked.Push(ctx, st, "runs/chunks", src, chunked.Options{}); err == nil {
		t.Error("a checkpoint named chunks was accepted")
	}
}

// Manifest objects are checked before anything is written: a hostile one cannot make a
// pull write outside its directory.
func TestLoadRejects(t *testing.T) {
	ctx := context.Background()
	st := store.NewDir(t.TempDir())
	m, _, err := chunked.Push(ctx, st, "good", testImage(t, 0), chunked.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		edit func(m *chunked.Manifest)
		want string
	}{
		{"escaping path", func(m *chunked.Manifest) { m.Files[0].Path = "../../etc/cron.d/x" }, "is not inside the image"},
		{"absolute path", func(m *chunked.Manifest) { m.Files[0].Path = "/etc/passwd" }, "is not inside the image"},
		{"sizes disagree", func(m *chunked.Manifest) { m.Files[0].Size++ }, "chunks add up to"},
		{"bad hash", func(m *chunked.Manifest) {
			for i := range m.Files {
				for j := range m.Files[i].Chunks {
					m.Files[i].Chunks[j].SHA256 = "xyz"
					m.Files[i].Chunks[j].Zero = false
				}
			}
		}, "invalid chunk"},
		{"no image manifest", func(m *chunked.Manifest) {
			m.Files = slices.DeleteFunc(m.Files, func(f chunked.File) bool { return f.Path == image.ManifestName })
		}, "no manifest.json"},
		{"newer format", func(m *chunked.Manifest) { m.Format = chunked.FormatVersion + 1 }, "upgrade gpucr"},
		// A pull fetches a chunk once and writes it wherever it is listed: a chunk of 8 MiB
		// listed again as 1 byte would write 8 MiB where 1 byte is declared, again and again.
		{"a chunk listed again smaller", func(m *chunked.Manifest) {
			big := m.Files[slices.IndexFunc(m.Files, func(f chunked.File) bool { return f.Path == "criu/pages-1.img" })].Chunks[0]
			for k := range 3 {
				m.Files = append(m.Files, chunked.File{Path: fmt.Sprintf("criu/x-%d.img", k), Size: 1,
					Chunks: []chunked.Chunk{{Size: 1, SHA256: big.SHA256, XXH64: big.XXH64}}})
			}
		}, "another size or digest"},
		{"compression", func(m *chunked.Manifest) { m.Compression = "lz4" }, `unknown compression "lz4"`},
		// Decoded, every entry costs ~100 bytes however short: 63 MiB of them took 5 GB.
		{"a million entries", func(m *chunked.Manifest) {
			m.Files[0].Chunks = append(m.Files[0].Chunks, make([]chunked.Chunk, 1<<20)...)
		}, "entries, more than"},
		// A pull creates every file listed: 200,000 empty ones took as many inodes.
		{"too many files", func(m *chunked.Manifest) {
			for k := range chunked.MaxFiles {
				m.Files = append(m.Files, chunked.File{Path: fmt.Sprintf("criu/x-%d.img", k)})
			}
		}, "files listed, more than"},
		{"too many logs", func(m *chunked.Manifest) { m.Files = append(m.Files, logs(257)...) }, "of CRIU's logs listed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c chunked.Manifest
			b, _ := json.Marshal(m)
			if err := json.Unmarshal(b, &c); err != nil {
				t.Fatal(err)
			}
			tt.edit(&c)
			b, _ = json.Marshal(&c)
			put(t, st, chunked.ManifestKey("bad"), b)
			dst := filepath.Join(t.TempDir(), "img")
			_, _, err := chunked.Pull(ctx, st, "bad", dst, chunked.Options{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Pull = %v, want %q", err, tt.want)
			}
			if _, err := os.Stat(dst); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("a refused pull created %s", dst)
			}
		})
	}
}

// In a local store others can write, a push reads back, by its SHA-256, each chunk it would
// reuse: one planted under its name with other bytes is stored again, so the checkpoint is
// whole (before, it was refused only when pulled: a job lost). In a store only its user
// can write, a stored chunk is taken on its name.
func TestPushReplacesAChunkPlantedInASharedStore(t *testing.T) {
	for name, mode := range map[string]os.FileMode{"shared": 0o777, "own": 0o700} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			root := filepath.Join(t.TempDir(), "store")
			if err := os.Mkdir(root, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(root, mode); err != nil {
				t.Fatal(err)
			}
			st := store.NewDir(root)
			img := testImage(t, 0)
			if _, _, err := chunked.Push(ctx, st, "job/1", img, chunked.Options{}); err != nil {
				t.Fatal(err)
			}
			m, err := chunked.Load(ctx, st, "job/1")
			if err != nil {
				t.Fatal(err)
			}
			var planted string
			for _, f := range m.Files {
				if f.Path == "criu/pages-1.img" {
					planted = chunked.ChunkKey("job/1", f.Chunks[0].SHA256)
				}
			}
			enc, _ := zstd.NewWriter(nil)
			put(t, st, planted, enc.EncodeAll(random(99, chunk), nil))

			_, stats, err := chunked.Push(ctx, st, "job/2", img, chunked.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if want := map[string]int{"shared": 1, "own": 0}[name]; stats.Replaced != want {
				t.Fatalf("the second push replaced %d chunks, want %d: %+v", stats.Replaced, want, stats)
			}
			if name == "own" {
				return
			}
			for _, prefix := range []string{"job/1", "job/2"} {
				dst := filepath.Join(t.TempDir(), "img")
				if _, _, err := chunked.Pull(ctx, st, prefix, dst, chunked.Options{}); err != nil {
					t.Fatalf("pull %s: %v", prefix, err)
				}
				sameTree(t, img, dst)
			}
		})
	}
}

// A manifest object listing one chunk at many places would have a pull, or a streamed
// restore's fetch of CRIU's files, write far more than the chunks it fetches (hostile tests
// filled a tmpfs, and root's TMPDIR, from 1 KiB of chunk data): what does not fit, keeping
// 5% free, is refused before anything is written. The streamed restore's own bound (5% of
// the image, at most 1 GiB) is met here with gigabytes of zero chunks listed as memory.
func TestPullRefusesWhatDoesNotFit(t *testing.T) {
	ctx := context.Background()
	st := store.NewDir(t.TempDir())
	m, _, err := chunked.Push(ctx, st, "ckpt", testImage(t, 0), chunked.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range m.Files {
		if f.Path == "criu/pages-1.img" {
			c := f.Chunks[4] // random(2): not a zero chunk
			m.Files[i].Chunks = slices.Repeat([]chunked.Chunk{c}, 64)
			m.Files[i].Size = 64 * c.Size
		}
	}
	zeros := chunked.File{Path: "mem/1-7f0000000000.img", Size: 2048 * chunk,
		Chunks: slices.Repeat([]chunked.Chunk{{Size: chunk, Zero: true}}, 2048)}
	m.Files = append(m.Files, zeros)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	put(t, st, chunked.ManifestKey("ckpt"), b)
	for name, fetch := range map[string]func(parent string) error{
		"pull": func(parent string) error {
			_, _, err := chunked.Pull(ctx, st, "ckpt", filepath.Join(parent, "img"), chunked.Options{})
			return err
		},
		"streamed restore": func(parent string) error {
			s, err := chunked.Stage(ctx, st, "ckpt", parent, chunked.Options{})
			if err == nil {
				s.Close()
			}
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			parent := testutil.SmallTmpfs(t, "64m")
			var full *diskroom.FullError
			if err := fetch(parent); !errors.As(err, &full) {
				t.Fatalf("%s = %v, want a refusal for room", name, err)
			}
			if entries, _ := os.ReadDir(parent); len(entries) != 0 {
				t.Errorf("the refused %s left %d entries", name, len(entries))
			}
		})
	}
}

// logs is n empty CRIU logs, as a manifest object lists them.
func logs(n int) []chunked.File {
	out := make([]chunked.File, n)
	for k := range out {
		out[k] = chunked.File{Path: fmt.Sprintf("%s/l%d", image.LogsDir, k)}
	}
	return out
}

// A pull holds no file open beyond the one it writes: one that held each one it created
// failed with "too many open files" on a manifest listing 200,000.
func TestPullHoldsItsFilesOpenOneAtATime(t *testing.T) {
	ctx := context.Background()
	st := store.NewDir(t.TempDir())
	m, _, err := chunked.Push(ctx, st, "ckpt", testImage(t, 0), chunked.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m.Files = append(m.Files, logs(200)...)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	put(t, st, chunked.ManifestKey("ckpt"), b)
	testutil.WithFileLimit(t, 64, func() {
		_, _, err = chunked.Pull(ctx, st, "ckpt", filepath.Join(t.TempDir(), "img"), chunked.Options{})
	})
	if err != nil {
		t.Fatalf("pull of %d files with 64 descriptors: %v", len(m.Files), err)
	}
}

// Nulls in an array open no object, yet each decodes to a whole struct where the array
// holds structs (13 million took 4.4 GB of ls in a hostile test): a manifest object's
// values are bounded as its objects are, before it is decoded.
func TestLoadRefusesMillionsOfValues(t *testing.T) {
	ctx := context.Background()
	st := store.NewDir(t.TempDir())
	if _, _, err := chunked.Push(ctx, st, "job", testImage(t, 0), chunked.Options{}); err != nil {
		t.Fatal(err)
	}
	r, err := st.Get(ctx, chunked.ManifestKey("job"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(r)
	r.Close()
	if err != nil {
		t.Fatal(err)
	}
	nulls := `"devices":[null` + strings.Repeat(",null", 7<<20) + `],"files":`
	if !bytes.Contains(b, []byte(`"files":`)) {
		t.Fatalf("no files in the manifest object:\n%.300s", b)
	}
	put(t, st, chunked.ManifestKey("job"), bytes.Replace(b, []byte(`"files":`), []byte(nulls), 1))
	if _, err := chunked.Load(ctx, st, "job"); !errors.Is(err, chunked.ErrBadManifest) || !strings.Contains(err.Error(), "values, more than") {
		t.Fatalf("Load = %v, want the values refused", err)
	}
}
