package chunked_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/image/imagetest"
	"github.com/gpucr/gpucr/internal/signing"
	"github.com/gpucr/gpucr/internal/store"
	"github.com/gpucr/gpucr/internal/store/chunked"
)

const memFile = "mem/42-7f0000000000.img"

// memImage commits an image of small CRIU files, a CRIU page file of pages bytes of zeros,
// and memory gpucr saved: a chunk and a half of random bytes (seed), a chunk and a half of
// zeros (one zero chunk) and a short tail, so that its last piece is short. It returns the
// image and the memory.
func memImage(t *testing.T, seed uint64, pages int) (string, []byte) {
	t.Helper()
	mem := bytes.Join([][]byte{random(seed, 3*chunk/2), make([]byte, 3*chunk/2), random(seed+1, 1234)}, nil)
	return memImageOf(t, mem, pages, nil), mem
}

// memImageOf commits the image memImage does with the memory mem, signed by key if not nil.
func memImageOf(t *testing.T, mem []byte, pages int, key ed25519.PrivateKey) string {
	t.Helper()
	files := map[string][]byte{
		"criu/pages-1.img":   make([]byte, pages),
		"criu/pagemap-1.img": []byte("pagemap"),
		"criu/pstree.img":    []byte("pstree"),
		"logs/dump.log":      []byte("dump log\n"),
		memFile:              mem,
	}
	m := &image.Manifest{GpucrVersion: "test", Created: time.Now().UTC(), RootPID: 42, MemoryBytes: uint64(len(mem)),
		Host: image.HostInfo{Hostname: "h"}, Processes: []image.Process{{PID: 42, PPID: 1, Command: "counter", Threads: 1}}}
	return imagetest.Commit(t, files, m, key)
}

// swapMemory pushes image a to "a" and image b to "b" in st, then rewrites a's manifest
// object to list b's chunks for the memory file, as whoever can write a store can: every
// chunk whole, its sha256 and xxh64 right. It returns b's manifest object.
func swapMemory(t *testing.T, st store.Store, a, b string) *chunked.Manifest {
	t.Helper()
	ctx := context.Background()
	if _, _, err := chunked.Push(ctx, st, "a", a, chunked.Options{}); err != nil {
		t.Fatal(err)
	}
	mb, _, err := chunked.Push(ctx, st, "b", b, chunked.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ma, err := chunked.Load(ctx, st, "a")
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(ma.Files, func(f chunked.File) bool { return f.Path == memFile })
	j := slices.IndexFunc(mb.Files, func(f chunked.File) bool { return f.Path == memFile })
	ma.Files[i].Chunks = mb.Files[j].Chunks
	raw, _ := json.Marshal(ma)
	if err := st.Put(ctx, chunked.ManifestKey("a"), raw); err != nil {
		t.Fatal(err)
	}
	return mb
}

// readAll reads the memory file through mem as the fill does, in aligned image pieces.
func readAll(t *testing.T, mem *chunked.Memory, size int) ([]byte, error) {
	t.Helper()
	var out []byte
	for off := 0; off < size; off += image.HashChunkSize {
		b, err := readPiece(mem, int64(off), min(size-off, image.HashChunkSize))
		if err != nil {
			return nil, err
		}
		out = append(out, b...)
	}
	return out, nil
}

// readPiece reads n bytes of the memory file from off through mem as the fill does: from
// the parts handed to use, in order, which need not lie in the buffer given.
func readPiece(mem *chunked.Memory, off int64, n int) ([]byte, error) {
	out, next := make([]byte, n), 0
	err := mem.ReadPiece(context.Background(), memFile, off, make([]byte, n), func(at int, part []byte) error {
		if at != next {
			return fmt.Errorf("a part at %d, want one at %d", at, next)
		}
		next += copy(out[at:], part)
		return nil
	})
	if err == nil && next != n {
		err = fmt.Errorf("parts ended at %d of %d bytes", next, n)
	}
	return out, err
}

// A push lists the files in the order a restore needs them; a staged checkpoint has every
// file but the saved memory locally, the same bytes, and serves the memory piece by piece,
// verified whole only once every piece was read.
func TestStageServesMemoryFromTheStore(t *testing.T) {
	for name, open := range stores(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			st := open(t)
			src, want := memImage(t, 1, 2*mib)
			m, _, err := chunked.Push(ctx, st, "jobs/ckpt-1", src, chunked.Options{})
			if err != nil {
				t.Fatal(err)
			}
			var order []string
			for _, f := range m.Files {
				order = append(order, f.Path)
			}
			wantOrder := []string{image.ManifestName, image.SealName, "criu/pagemap-1.img", "criu/pstree.img", "criu/pages-1.img", memFile, "logs/dump.log"}
			if !slices.Equal(order, wantOrder) {
				t.Errorf("manifest order %v, want %v", order, wantOrder)
			}

			parent := t.TempDir()
			s, err := chunked.Stage(ctx, st, "jobs/ckpt-1", parent, chunked.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(s.Dir, memFile)); err == nil {
				t.Error("the saved memory was fetched to local disk")
			}
			for _, p := range wantOrder[:5] {
				a, _ := os.ReadFile(filepath.Join(src, p))
				if b, err := os.ReadFile(filepath.Join(s.Dir, p)); err != nil || !bytes.Equal(a, b) {
					t.Errorf("%s: staged %d bytes (%v), want %d", p, len(b), err, len(a))
				}
			}
			if s.Local != s.Stats.Bytes || s.Local > chunked.LocalBound(int64(len(want))) {
				t.Errorf("local need %d for %d bytes fetched", s.Local, s.Stats.Bytes)
			}
			if err := s.Memory.Verify(); !errors.Is(err, image.ErrCorrupt) {
				t.Errorf("Verify before any read = %v, want a corrupt image", err)
			}
			got, err := readAll(t, s.Memory, len(want))
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("memory read back: %v, equal %v", err, bytes.Equal(got, want))
			}
			// An unaligned read spanning chunks is served too (it is not hashed).
			if part, err := readPiece(s.Memory, 3*mib+7, 5*mib); err != nil || !bytes.Equal(part, want[3*mib+7:8*mib+7]) {
				t.Fatalf("unaligned read: %v", err)
			}
			// A read of nothing, even at the end, reads nothing.
			if part, err := readPiece(s.Memory, int64(len(want)), 0); err != nil || len(part) != 0 {
				t.Fatalf("empty read at the end: %d bytes, %v", len(part), err)
			}
			if err := s.Memory.Verify(); err != nil {
				t.Fatalf("Verify after a whole read: %v", err)
			}
			if st := s.Memory.Stats(); st.ZeroBytes != chunk || st.Transferred == 0 {
				t.Errorf("memory stats %+v", st)
			}
			s.Close()
			if entries, _ := os.ReadDir(parent); len(entries) != 0 {
				t.Errorf("Close left %d entries", len(entries))
			}
		})
	}
}

// The store is written by others. A chunk whose bytes changed fails the read that needs
// it, naming it; a manifest object rewritten to list another image's chunks (each one
// whole, sha256 and all) reads, but Verify refuses the memory before any task may resume.
func TestStagedMemoryRefusesOtherBytes(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	st := store.NewDir(root)
	a, want := memImage(t, 1, 0)
	b, _ := memImage(t, 7, 0)
	mb := swapMemory(t, st, a, b)
	s, err := chunked.Stage(ctx, st, "a", t.TempDir(), chunked.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := readAll(t, s.Memory, len(want)); err != nil {
		t.Fatalf("chunks of another image read: %v", err)
	}
	if err := s.Memory.Verify(); !errors.Is(err, image.ErrCorrupt) || !strings.Contains(err.Error(), memFile) {
		t.Fatalf("Verify = %v, want the memory file named as corrupt", err)
	}

	s2, err := chunked.Stage(ctx, st, "b", t.TempDir(), chunked.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	j := slices.IndexFunc(mb.Files, func(f chunked.File) bool { return f.Path == memFile })
	first := mb.Files[j].Chunks[0]
	obj := filepath.Join(root, filepath.FromSlash(chunked.ChunkKey("b", first.SHA256)))
	if err := os.WriteFile(obj, []byte("not zstd"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readAll(t, s2.Memory, len(want)); !errors.Is(err, chunked.ErrBadChunk) || !strings.Contains(err.Error(), memFile) {
		t.Fatalf("a damaged chunk: %v", err)
	}
}

// A signed image's memory is checked by SHA-256 as it streams from the store: a manifest
// object rewritten to list chunks of memory forged to keep every xxh64 (whole chunks,
// sha256 and all, pushed by whoever can write the store) is refused before any task may
// resume.
func TestStagedSignedMemoryRefusesForgedBytes(t *testing.T) {
	ctx := context.Background()
	st := store.NewDir(t.TempDir())
	_, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	_, want := memImage(t, 1, 0)
	forged := bytes.Clone(want)
	imagetest.ForgeXXH64(forged[:image.HashChunkSize], 100, 0x90)
	swapMemory(t, st, memImageOf(t, want, 0, key), memImageOf(t, forged, 0, nil))
	s, err := chunked.Stage(ctx, st, "a", t.TempDir(), chunked.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := readAll(t, s.Memory, len(want))
	if err != nil || !bytes.Equal(got, forged) {
		t.Fatalf("the forged chunks must read for this test to mean anything: %v", err)
	}
	if err := s.Memory.Verify(); !errors.Is(err, image.ErrCorrupt) || !strings.Contains(err.Error(), "SHA-256 mismatch") {
		t.Fatalf("Verify = %v, want the forged memory refused by its SHA-256", err)
	}
}

// A checkpoint whose CRIU files would take more local disk than the bound is refused
// before anything is fetched.
func TestStageRefusesLargeCRIUFiles(t *testing.T) {
	ctx := context.Background()
	st := store.NewDir(t.TempDir())
	src, _ := memImage(t, 1, 40*mib) // CRIU's 40 MiB: over 32 MiB
	if _, _, err := chunked.Push(ctx, st, "big", src, chunked.Options{}); err != nil {
		t.Fatal(err)
	}
	parent := t.TempDir()
	_, err := chunked.Stage(ctx, st, "big", parent, chunked.Options{})
	if !errors.Is(err, chunked.ErrTooMuchLocal) || !strings.Contains(err.Error(), "gpucr pull") {
		t.Fatalf("Stage = %v, want a refusal that suggests pull", err)
	}
	if entries, _ := os.ReadDir(parent); len(entries) != 0 {
		t.Errorf("a refused stage left %d entries", len(entries))
	}
}

// The manifest object is not signed: it may list files the image's manifest does not. A
// trusted pull or streamed restore takes none that the image's check would let by unread
// (CRIU's logs, an interrupted sign's leftovers): a "trusted" image holds signed bytes only.
// An untrusted pull keeps the logs (they are for people), never the leftovers.
func TestTrustedPullTakesOnlySignedFiles(t *testing.T) {
	ctx := context.Background()
	st := store.NewDir(t.TempDir())
	pub, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	_, mem := memImage(t, 1, 0)
	m, _, err := chunked.Push(ctx, st, "signed", memImageOf(t, mem, 0, key), chunked.Options{})
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(m.Files, func(f chunked.File) bool { return f.Path == "criu/pstree.img" })
	for _, extra := range []string{"logs/run-me.sh", image.ManifestName + ".new"} {
		f := m.Files[i]
		f.Path = extra
		m.Files = append(m.Files, f)
	}
	raw, _ := json.Marshal(m)
	if err := st.Put(ctx, chunked.ManifestKey("signed"), raw); err != nil {
		t.Fatal(err)
	}
	trusted := chunked.Options{Trust: signing.Keys{signing.ID(pub): pub}}
	for name, c := range map[string]struct {
		o    chunked.Options
		logs bool
	}{"trusted": {trusted, false}, "untrusted": {chunked.Options{}, true}} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "img")
			if _, _, err := chunked.Pull(ctx, st, "signed", dir, c.o); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(dir, "logs", "run-me.sh")); (err == nil) != c.logs {
				t.Errorf("logs/run-me.sh pulled: %v, want %v", err == nil, c.logs)
			}
			if _, err := os.Stat(filepath.Join(dir, image.ManifestName+".new")); err == nil {
				t.Error("an interrupted sign's leftover was pulled")
			}
			s, err := chunked.Stage(ctx, st, "signed", t.TempDir(), c.o)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if _, err := os.Stat(filepath.Join(s.Dir, "logs", "run-me.sh")); (err == nil) != c.logs {
				t.Errorf("logs/run-me.sh staged: %v, want %v", err == nil, c.logs)
			}
		})
	}
}

// A trusted pull checks the signed manifest before it fetches anything else, and takes
// nothing the signature does not list at its size: an unsigned image, or a listing that
// adds a file, is refused before the bulk is fetched (a hostile test's pull with --trust
// filled the disk, refused only once every byte had arrived). Each case also removes a
// chunk of the bulk: a pull that fetched it first would fail on the missing chunk instead.
func TestTrustedPullChecksTheSignatureFirst(t *testing.T) {
	ctx := context.Background()
	pub, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	trusted := chunked.Options{Trust: signing.Keys{signing.ID(pub): pub}}
	_, mem := memImage(t, 1, 0)
	for name, c := range map[string]struct {
		key  ed25519.PrivateKey
		edit func(m *chunked.Manifest)
		want error
	}{
		"unsigned": {nil, func(*chunked.Manifest) {}, signing.ErrUntrusted},
		"a file the signature does not list": {key, func(m *chunked.Manifest) {
			f := m.Files[slices.IndexFunc(m.Files, func(f chunked.File) bool { return f.Path == "criu/pstree.img" })]
			f.Path = "criu/extra.img"
			m.Files = append(m.Files, f)
		}, chunked.ErrBadManifest},
		// The manifest's own files are fetched first, before the signature is checked: one
		// listed larger than its reader reads is refused unfetched (a hostile test had a
		// gigabyte written as manifest.json).
		"a manifest listed as 72 MiB": {key, func(m *chunked.Manifest) {
			mem := m.Files[slices.IndexFunc(m.Files, func(f chunked.File) bool { return strings.HasPrefix(f.Path, "mem/") })].Chunks[0]
			i := slices.IndexFunc(m.Files, func(f chunked.File) bool { return f.Path == image.ManifestName })
			m.Files[i].Chunks = slices.Repeat([]chunked.Chunk{mem}, 9)
			m.Files[i].Size = 9 * mem.Size
		}, chunked.ErrBadManifest},
	} {
		t.Run(name, func(t *testing.T) {
			st := store.NewDir(t.TempDir())
			m, _, err := chunked.Push(ctx, st, "job", memImageOf(t, mem, 0, c.key), chunked.Options{})
			if err != nil {
				t.Fatal(err)
			}
			c.edit(m)
			raw, _ := json.Marshal(m)
			put(t, st, chunked.ManifestKey("job"), raw)
			for _, f := range m.Files {
				if strings.HasPrefix(f.Path, "mem/") {
					if err := st.Delete(ctx, chunked.ChunkKey("job", f.Chunks[0].SHA256)); err != nil {
						t.Fatal(err)
					}
					break
				}
			}
			// Nor is a file of CRIU's, which a streamed restore fetches: missing, it would fail
			// a fetch made before the signature was checked.
			pstree := m.Files[slices.IndexFunc(m.Files, func(f chunked.File) bool { return f.Path == "criu/pstree.img" })]
			if err := st.Delete(ctx, chunked.ChunkKey("job", pstree.Chunks[0].SHA256)); err != nil {
				t.Fatal(err)
			}
			parent := t.TempDir()
			if _, _, err := chunked.Pull(ctx, st, "job", filepath.Join(parent, "img"), trusted); !errors.Is(err, c.want) {
				t.Fatalf("Pull = %v, want %v", err, c.want)
			}
			// (The 72 MiB manifest is over a streamed restore's local bound before that.)
			if s, err := chunked.Stage(ctx, st, "job", parent, trusted); !errors.Is(err, c.want) && !errors.Is(err, chunked.ErrTooMuchLocal) {
				if s != nil {
					s.Close()
				}
				t.Fatalf("Stage (a streamed restore) = %v, want %v", err, c.want)
			}
			if entries, _ := os.ReadDir(parent); len(entries) != 0 {
				t.Errorf("the refused pull or stage left %d entries", len(entries))
			}
		})
	}
}
