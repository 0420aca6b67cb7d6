package chunked_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"testing"
	"testing/iotest"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/klauspost/compress/zstd"

	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/signing"
	"github.com/gpucr/gpucr/internal/store"
	"github.com/gpucr/gpucr/internal/store/chunked"
)

// A streamed page file is cut where its pages' addresses cross a ChunkSize window, like a
// pushed one; the sealed image it finishes pulls back whole and verified.
func TestStreamCutsByAddressAndPullsBack(t *testing.T) {
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			st := open(t)
			// Signed: the streamed file must come with its SHA-256, which only a Summer
			// that saw its bytes can give.
			pub, key, err := ed25519.GenerateKey(nil)
			if err != nil {
				t.Fatal(err)
			}
			s, err := chunked.NewStream(ctx, st, "jobs/ckpt-1", chunked.Options{Signed: true})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Abort()
			f, err := s.Create("criu/pages-65537.img")
			if err != nil {
				t.Fatal(err)
			}
			const page, w = 4096, chunked.ChunkSize
			runs := []struct {
				vaddr uint64
				data  []byte
			}{
				{w - page, random(1, 3*page)}, // crosses into the second window
				{w + w/4, random(2, w)},       // fills the second window, spills into the third
				{16 * w, make([]byte, 2*w)},   // two windows of zeros
			}
			var all []byte
			for _, r := range runs {
				if err := f.Receive(r.vaddr, len(r.data), bytes.NewReader(r.data)); err != nil {
					t.Fatal(err)
				}
				all = append(all, r.data...)
			}
			om, stats := finishStream(t, s, f, key)
			var sizes []int64
			var zero []bool
			for _, file := range om.Files {
				if file.Path == "criu/pages-65537.img" {
					for _, c := range file.Chunks {
						sizes = append(sizes, c.Size/page)
						zero = append(zero, c.Zero)
					}
				}
			}
			if want := []int64{1, 2 + 3*w/4/page, w / 4 / page, w / page, w / page}; !slices.Equal(sizes, want) || !zero[3] || !zero[4] || zero[0] {
				t.Errorf("chunks of the streamed pages file: %v pages (zero %v), want %v", sizes, zero, want)
			}
			if stats.ZeroBytes != 2*w || stats.Bytes < int64(len(all)) {
				t.Errorf("stats %+v", stats)
			}

			dst := filepath.Join(t.TempDir(), "pulled")
			trusted := chunked.Options{Trust: signing.Keys{signing.ID(pub): pub}}
			if pm, _, err := chunked.Pull(ctx, st, "jobs/ckpt-1", dst, trusted); err != nil || !pm.Digested() {
				t.Fatalf("trusted pull of the signed stream: %v", err)
			}
			got, err := os.ReadFile(filepath.Join(dst, "criu/pages-65537.img"))
			if err != nil || !bytes.Equal(got, all) {
				t.Fatalf("pulled pages file: %d bytes, want %d (%v)", len(got), len(all), err)
			}
		})
	}
}

// Every streamed chunk carries its own bytes' digests, and is stored under its SHA-256,
// whichever way they were taken while it arrived: from the image's checksum for a chunk that
// is one whole piece of its file (xxh64, and SHA-256 when signed), its own digests for one
// that is not (cut by the address window), or hashed by the worker for one that begins a
// piece and ends short. Parts arrive in sizes that match no chunk, piece or read step.
func TestStreamedChunksCarryTheirBytesDigests(t *testing.T) {
	for _, signed := range []bool{false, true} {
		t.Run(fmt.Sprintf("signed=%v", signed), func(t *testing.T) {
			ctx := context.Background()
			st := store.NewDir(t.TempDir())
			s, err := chunked.NewStream(ctx, st, "ckpt", chunked.Options{Signed: signed})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Abort()
			files := []struct {
				name  string
				vaddr uint64
				data  []byte
			}{
				{"mem/42-7f0000000000.img", 0, random(5, 2*chunk+1234)},              // whole pieces, then a short one
				{"mem/42-7f0000100000.img", chunk - 3*4096, random(6, 3*chunk+4096)}, // cut by the window: no piece whole
			}
			var streamed []*chunked.StreamFile
			for _, fl := range files {
				f, err := s.Create(fl.name)
				if err != nil {
					t.Fatal(err)
				}
				for at, step := 0, chunk/3+17; at < len(fl.data); at += step {
					part := fl.data[at:min(at+step, len(fl.data))]
					if err := f.Receive(fl.vaddr+uint64(at), len(part), bytes.NewReader(part)); err != nil {
						t.Fatal(err)
					}
				}
				streamed = append(streamed, f)
			}
			var key ed25519.PrivateKey
			if signed {
				if _, key, err = ed25519.GenerateKey(nil); err != nil {
					t.Fatal(err)
				}
			}
			if err := streamed[1].Close(); err != nil {
				t.Fatal(err)
			}
			om, _ := finishStream(t, s, streamed[0], key)
			for _, fl := range files {
				j := slices.IndexFunc(om.Files, func(f chunked.File) bool { return f.Path == fl.name })
				if j < 0 || len(om.Files[j].Chunks) < 3 {
					t.Fatalf("stored %s: %+v", fl.name, om.Files)
				}
				at := 0
				for k, c := range om.Files[j].Chunks {
					b := fl.data[at : at+int(c.Size)]
					at += int(c.Size)
					if sum := sha256.Sum256(b); c.SHA256 != hex.EncodeToString(sum[:]) || c.XXH64 != fmt.Sprintf("%016x", xxhash.Sum64(b)) {
						t.Errorf("%s chunk %d: sha256 %s xxh64 %s, not its bytes' digests", fl.name, k, c.SHA256, c.XXH64)
					}
					if got := storedChunk(t, st, "ckpt", c.SHA256); !bytes.Equal(got, b) {
						t.Errorf("%s chunk %d: the object under its name holds other bytes", fl.name, k)
					}
				}
			}
			dst := filepath.Join(t.TempDir(), "pulled")
			if _, _, err := chunked.Pull(ctx, st, "ckpt", dst, chunked.Options{}); err != nil {
				t.Fatal(err)
			}
			for _, fl := range files {
				if got, err := os.ReadFile(filepath.Join(dst, filepath.FromSlash(fl.name))); err != nil || !bytes.Equal(got, fl.data) {
					t.Fatalf("pulled %s: %d bytes (%v), want %d", fl.name, len(got), err, len(fl.data))
				}
			}
		})
	}
}

// A Receive that fails midway (CRIU hanging up on the page server) and the Close that
// follows it store no object whose bytes are not its name: the digests took only what was
// read, so must the chunk. Such an object in the shared chunks/ would be reused by a later,
// good checkpoint of the same job, which then never restores (review).
func TestFailedReceiveStoresNoChunkUnderAnotherName(t *testing.T) {
	ctx := context.Background()
	st := store.NewDir(t.TempDir())
	lead, next, lost := random(11, 4096), random(12, 4096), random(13, 8192)
	s, err := chunked.NewStream(ctx, st, "jobs/a", chunked.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f, err := s.Create("criu/pages-1.img")
	if err != nil {
		t.Fatal(err)
	}
	// lead ends the first window; next begins the second, a chunk not at a piece of the
	// file: its digests are its own, taken as it arrives.
	if err := f.Receive(chunk-4096, len(lead), bytes.NewReader(lead)); err != nil {
		t.Fatal(err)
	}
	if err := f.Receive(chunk, len(next), bytes.NewReader(next)); err != nil {
		t.Fatal(err)
	}
	cut := io.MultiReader(bytes.NewReader(lost[:4096]), iotest.ErrReader(errors.New("connection reset")))
	if err := f.Receive(chunk+4096, len(lost), cut); err == nil {
		t.Fatal("a receive from a reader that failed midway succeeded")
	}
	_ = f.Close()
	_, _ = s.Files()
	s.Abort()
	stored, err := st.List(ctx, "jobs/"+chunked.ChunksDir)
	if err != nil || len(stored) == 0 {
		t.Fatalf("chunks stored: %v, %v", stored, err)
	}
	for _, e := range stored {
		name := path.Base(e.Key)
		b := storedChunk(t, st, "jobs/a", name)
		if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != name {
			t.Errorf("chunk %s holds %d bytes whose SHA-256 is %x", name, len(b), sum)
		}
	}
}

// storedChunk is the content of the object the checkpoint at prefix in st names by sum.
func storedChunk(t *testing.T, st store.Store, prefix, sum string) []byte {
	t.Helper()
	r, err := st.Get(context.Background(), chunked.ChunkKey(prefix, sum))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	dec, err := zstd.NewReader(r)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	b, err := io.ReadAll(dec)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// finishStream closes f, the one file streamed into s, seals an image around it (a pagemap
// beside it; signed by key, when not nil) and finishes s: the manifest object and stats.
func finishStream(t *testing.T, s *chunked.Stream, f *chunked.StreamFile, key ed25519.PrivateKey) (*chunked.Manifest, *chunked.Stats) {
	t.Helper()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	streamed, err := s.Files()
	if err != nil {
		t.Fatal(err)
	}
	stage, err := image.Begin(filepath.Join(t.TempDir(), "img"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := stage.Abort(); err != nil {
			t.Error(err)
		}
	}()
	stage.SignWith = key
	if err := os.WriteFile(filepath.Join(stage.CRIUDir(), "pagemap-42.img"), []byte("pagemap"), 0o600); err != nil {
		t.Fatal(err)
	}
	m := &image.Manifest{GpucrVersion: "test", Created: time.Now().UTC(), RootPID: 42, Processes: []image.Process{{PID: 42}}}
	if err := stage.Seal(m, streamed); err != nil {
		t.Fatal(err)
	}
	om, stats, err := s.Finish(context.Background(), stage.Dir(), m)
	if err != nil {
		t.Fatal(err)
	}
	return om, stats
}
