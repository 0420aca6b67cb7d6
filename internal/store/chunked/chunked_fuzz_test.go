package chunked

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/crit"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pagemap"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/fuzzcheck"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/store"
)

// oneObject is a store holding one object, in memory.
type oneObject struct {
	key  string
	data []byte
}

var errReadOnly = errors.New("read-only store")

func (s *oneObject) Get(_ context.Context, key string) (io.ReadCloser, error) {
	if key != s.key {
		return nil, store.ErrNotFound
	}
	return io.NopCloser(bytes.NewReader(s.data)), nil
}
func (s *oneObject) Put(context.Context, string, []byte) error           { return errReadOnly }
func (s *oneObject) Create(context.Context, string, []byte) error        { return errReadOnly }
func (s *oneObject) Stat(context.Context, string) (int64, error)         { return 0, errReadOnly }
func (s *oneObject) List(context.Context, string) ([]store.Entry, error) { return nil, errReadOnly }
func (s *oneObject) Delete(context.Context, string) error                { return errReadOnly }
func (s *oneObject) URL(key string) string                               { return "mem://" + key }

func sum(b string) string {
	h := sha256.Sum256([]byte(b))
	return hex.EncodeToString(h[:])
}

// sampleManifest is a manifest object as Push writes one: an image manifest, a pages file
// of stored and zero chunks, an empty file.
func sampleManifest() *Manifest {
	return &Manifest{
		Format: FormatVersion, ChunkSize: ChunkSize, Compression: compression,
		Pushed: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Image: image.Manifest{FormatVersion: image.FormatVersion, GpucrVersion: "test", RootPID: 42,
			Processes: []image.Process{{PID: 42, PPID: 1, Command: "python", Threads: 3}},
			Files:     []image.File{{Path: "criu/pages-1.img", Size: 3*ChunkSize + 17, XXH64: "0123456789abcdef"}}},
		Files: []File{
			{Path: image.ManifestName, Size: 900, Chunks: []Chunk{{Size: 900, SHA256: sum("m"), Stored: 400}}},
			{Path: image.SealName, Size: 65, Chunks: []Chunk{{Size: 65, SHA256: sum("s"), Stored: 70}}},
			{Path: "criu/pages-1.img", Size: 3*ChunkSize + 17, Chunks: []Chunk{
				{Size: ChunkSize, SHA256: sum("a"), Stored: 1 << 20}, {Size: ChunkSize, Zero: true},
				{Size: ChunkSize, SHA256: sum("a"), Stored: 1 << 20}, {Size: 17, SHA256: sum("b"), Stored: 30}}},
			{Path: "criu/empty.img", Size: 0},
		},
	}
}

// A manifest object comes from the store, which others can write. Load refuses it as a bad
// manifest, or one of a newer format, or returns one a pull can follow safely: paths inside
// the image, each listed once, chunks that add up to their files. What it accepts, encoded
// again, loads again to the same manifest.
func FuzzLoad(f *testing.F) {
	good, err := json.Marshal(sampleManifest())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	for _, edit := range []func(m *Manifest){
		func(m *Manifest) { m.Files[2].Path = "../criu/pages-1.img" },
		func(m *Manifest) { m.Files[2].Path = "/etc/passwd" },
		func(m *Manifest) { m.Files[2].Path = "criu/./pages-1.img" },
		func(m *Manifest) { m.Files[3].Path = m.Files[2].Path },
		func(m *Manifest) { m.Files[2].Chunks[3].Size = -ChunkSize },
		func(m *Manifest) { m.Files[2].Chunks[1].Size = ChunkSize + 1 },
		func(m *Manifest) { m.Files[2].Chunks[0].SHA256 = sum("a")[:63] + "G" },
		func(m *Manifest) { m.Files[2].Chunks[3].SHA256 = sum("a") }, // a's again, 17 bytes
		func(m *Manifest) { m.Format = FormatVersion + 1 },
		func(m *Manifest) { m.Format = 0 },                     // listed with blank columns, and pulled (hostile test)
		func(m *Manifest) { m.ChunkSize = 0 },                  // likewise
		func(m *Manifest) { m.Files[2].Chunks[0].Stored = -1 }, // ls showed 16 EiB stored
	} {
		m := sampleManifest()
		edit(m)
		b, _ := json.Marshal(m)
		f.Add(b)
	}
	f.Add([]byte(`{"format":1,"compression":"zstd","files":[{"path":"manifest.json","size":0,"chunks":null}]}`))
	f.Add([]byte(`{"format":99,"files":"not even a list"}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{}`))
	f.Add(good[:len(good)/2])
	ctx := context.Background()
	const prefix = "jobs/run/ckpt"
	if _, err := Load(ctx, &oneObject{key: ManifestKey(prefix), data: good}, prefix); err != nil {
		f.Fatalf("the sample manifest: %v", err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		st := &oneObject{key: ManifestKey(prefix), data: data}
		var m *Manifest
		var err error
		if n := fuzzcheck.Allocated(func() { m, err = Load(ctx, st, prefix) }); n > fuzzcheck.AllocSlack+uint64(256*len(data)) {
			t.Fatalf("Load allocated %d bytes for a %d-byte manifest", n, len(data))
		}
		if err != nil {
			if !errors.Is(err, ErrBadManifest) && !errors.Is(err, ErrNewerFormat) {
				t.Fatalf("Load = %v: neither a bad manifest nor a newer format", err)
			}
			return
		}
		if m.Format < 1 || m.Format > FormatVersion || m.ChunkSize <= 0 || m.ChunkSize > ChunkSize || m.Compression != compression || len(m.Files) == 0 {
			t.Fatalf("accepted format %d, chunk size %d, compression %q, %d files", m.Format, m.ChunkSize, m.Compression, len(m.Files))
		}
		if m.StoredBytes() < 0 {
			t.Fatalf("accepted a manifest storing %d bytes", m.StoredBytes())
		}
		seen := map[string]bool{}
		chunks := map[string]Chunk{}
		for _, file := range m.Files {
			if !filepath.IsLocal(file.Path) || path.Clean(file.Path) != file.Path || seen[file.Path] {
				t.Fatalf("accepted file path %q (listed before: %v)", file.Path, seen[file.Path])
			}
			seen[file.Path] = true
			var total int64
			for _, c := range file.Chunks {
				if c.Size <= 0 || c.Size > ChunkSize || !c.Zero && !image.IsSHA256(c.SHA256) {
					t.Fatalf("%s: accepted chunk %+v", file.Path, c)
				}
				if first, ok := chunks[c.SHA256]; ok && !c.Zero && (first.Size != c.Size || first.XXH64 != c.XXH64) {
					t.Fatalf("%s: accepted chunk %+v, listed before as %+v", file.Path, c, first)
				}
				if !c.Zero {
					chunks[c.SHA256] = c
				}
				total += c.Size
			}
			if total != file.Size || file.Size < 0 {
				t.Fatalf("%s: %d bytes, its chunks %d", file.Path, file.Size, total)
			}
		}
		if !seen[image.ManifestName] {
			t.Fatalf("accepted without %s", image.ManifestName)
		}
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("encode an accepted manifest: %v", err)
		}
		again, err := Load(ctx, &oneObject{key: st.key, data: b}, prefix)
		if err != nil {
			t.Fatalf("an accepted manifest, encoded again, is refused: %v", err)
		}
		if b2, _ := json.Marshal(again); !bytes.Equal(b, b2) {
			t.Fatalf("an accepted manifest changes when loaded again:\n%s\n%s", b, b2)
		}
	})
}

func pmEntry(vaddr uint64, pages uint32, flags uint32) *pagemap.PagemapEntry {
	return &pagemap.PagemapEntry{Vaddr: proto.Uint64(vaddr), NrPages: proto.Uint32(pages), Flags: proto.Uint32(flags)}
}

// presentPages lists the address of each page the pagemap puts in the pages file, in file
// order; nil and false if there are more than most.
func presentPages(entries []*pagemap.PagemapEntry, most int) ([]uint64, bool) {
	var out []uint64
	for _, e := range entries {
		if !criuimg.Present(e) {
			continue
		}
		if len(out)+int(e.GetNrPages()) > most {
			return nil, false
		}
		for p := range uint64(e.GetNrPages()) {
			out = append(out, e.GetVaddr()+p*criuimg.PageSize)
		}
	}
	return out, true
}

// The pagemaps come from the image being pushed. pageCuts cuts a pages file only where the
// pagemap accounts for its size exactly, into chunks of at most ChunkSize bytes of whole
// pages, each the pages of one ChunkSize window of address space; it never walks or keeps
// more than the files' sizes allow, however many pages the entries claim.
func FuzzPageCuts(f *testing.F) {
	const present, parent, lazy = criuimg.PEPresent, 1, 2
	seed := func(size int64, entries ...*pagemap.PagemapEntry) {
		f.Add(fuzzcheck.Pagemap(f, 1, entries...), size)
	}
	seed(5*criuimg.PageSize, pmEntry(0x400000, 2, present), pmEntry(0x600000, 4, parent), pmEntry(0x7f0000000000, 3, present))
	seed(2048*criuimg.PageSize, pmEntry(0x7f00003ff000, 2048, present)) // crosses windows mid-run
	seed(2*criuimg.PageSize, pmEntry(0x1000, 1, present), pmEntry(0x1000+ChunkSize, 1, lazy), pmEntry(0x2000+ChunkSize, 1, present))
	seed(criuimg.PageSize, &pagemap.PagemapEntry{Vaddr: proto.Uint64(0x1000), NrPages: proto.Uint32(1)})              // no flags: present
	seed(0, &pagemap.PagemapEntry{Vaddr: proto.Uint64(0x1000), NrPages: proto.Uint32(1), InParent: proto.Bool(true)}) // no flags: in the parent
	seed(1<<30, pmEntry(0, 0xffffffff, present), pmEntry(0, 0xffffffff, present), pmEntry(0, 0xffffffff, present))    // 48 TiB claimed
	seed(criuimg.PageSize, pmEntry(0xfffffffffffff000, 1, present))
	seed(2*ChunkSize, pmEntry(ChunkSize, ChunkSize/criuimg.PageSize, present), pmEntry(ChunkSize, ChunkSize/criuimg.PageSize, present)) // one window twice: a push crashed on it (review)
	seed(0)
	f.Add(fuzzcheck.Pagemap(f, 1)[:8], int64(0))
	f.Add([]byte{}, int64(0))
	dir := f.TempDir()
	if err := os.Mkdir(filepath.Join(dir, image.CRIUDir), 0o700); err != nil {
		f.Fatal(err)
	}
	path := filepath.Join(dir, image.CRIUDir, "pagemap-1.img")
	// Two windows' worth of pages from one page before a window's end.
	const across = 2 * ChunkSize / criuimg.PageSize
	if err := os.WriteFile(path, fuzzcheck.Pagemap(f, 1, pmEntry(0x7f0000000000+ChunkSize-criuimg.PageSize, across, present)), 0o600); err != nil {
		f.Fatal(err)
	}
	held := func(t testing.TB) *heldFiles {
		h, err := holdFiles(dir, []string{image.CRIUDir + "/pagemap-1.img"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(h.close)
		return h
	}
	if got := pageCuts(held(f), []File{{Path: image.CRIUDir + "/pages-1.img", Size: across * criuimg.PageSize}}); !slices.Equal(got[image.CRIUDir+"/pages-1.img"], []int64{criuimg.PageSize, criuimg.PageSize + ChunkSize, across * criuimg.PageSize}) {
		f.Fatalf("a run across three windows is cut at %v", got)
	}
	f.Fuzz(func(t *testing.T, data []byte, size int64) {
		if size < 0 || size > 1<<32 {
			return // a pages file gpucr pushes is not negative; a larger one only takes longer
		}
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		files := []File{{Path: image.CRIUDir + "/pages-1.img", Size: size}, {Path: image.ManifestName, Size: 100}}
		var cuts map[string][]int64
		h := held(t)
		if n := fuzzcheck.Allocated(func() { cuts = pageCuts(h, files) }); n > fuzzcheck.AllocSlack+uint64(512*len(data))+uint64(32*(size/ChunkSize+1)) {
			t.Fatalf("pageCuts allocated %d bytes for a %d-byte pagemap and a %d-byte pages file", n, len(data), size)
		}
		limit := max(size, 100)
		id, ends, err := chunkEnds(os.DirFS(dir), image.CRIUDir+"/pagemap-1.img", limit)
		if err != nil {
			if len(cuts) != 0 {
				t.Fatalf("chunkEnds refuses the pagemap (%v), yet pageCuts cut %v", err, cuts)
			}
			return
		}
		if len(ends) > 0 && ends[len(ends)-1] > limit {
			t.Fatalf("cut a pages file at %d, past the %d bytes allowed", ends[len(ends)-1], limit)
		}
		var prev int64
		for _, e := range ends {
			if e <= prev || e-prev > ChunkSize || (e-prev)%criuimg.PageSize != 0 {
				t.Fatalf("chunk ends %v: not increasing whole pages of at most ChunkSize", ends)
			}
			prev = e
		}
		name := image.CRIUDir + "/pages-1.img"
		got, cut := cuts[name]
		if want := id == 1 && (len(ends) == 0 && size == 0 || len(ends) > 0 && ends[len(ends)-1] == size); cut != want {
			t.Fatalf("pages id %d, ends %v, file of %d bytes: cut %v", id, ends, size, cut)
		}
		if cut && !slices.Equal(got, ends) {
			t.Fatalf("pageCuts cut %v, chunkEnds says %v", got, ends)
		}

		// Page by page, where that is cheap: a chunk is the pages of one window.
		img, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer img.Close()
		decoded, err := crit.New(img, nil, "", false, true).Decode(&pagemap.PagemapEntry{})
		if err != nil {
			t.Fatalf("chunkEnds read a pagemap crit refuses: %v", err)
		}
		var entries []*pagemap.PagemapEntry
		for _, e := range decoded.Entries {
			if m, ok := e.Message.(*pagemap.PagemapEntry); ok {
				entries = append(entries, m)
			}
		}
		pages, ok := presentPages(entries, 1<<16)
		if !ok {
			return
		}
		if int64(len(pages))*criuimg.PageSize != prev {
			t.Fatalf("%d present pages, chunks end at %d", len(pages), prev)
		}
		window := func(i int) int64 { return int64(pages[i]) / ChunkSize }
		var start int
		for _, e := range ends {
			end := int(e / criuimg.PageSize)
			for i := start + 1; i < end; i++ {
				if window(i) != window(start) {
					t.Fatalf("chunk of pages %d-%d spans windows %d and %d", start, end, window(start), window(i))
				}
			}
			if end < len(pages) && window(end) == window(end-1) {
				t.Fatalf("cut at page %d inside window %d", end, window(end))
			}
			start = end
		}
	})
}
