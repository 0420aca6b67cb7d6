package memfill

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/checkpoint-restore/go-criu/v7/crit"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/mm"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pagemap"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/vma"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/meter"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/testutil"
)

func encode(t *testing.T, path, magic string, msgs ...proto.Message) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img := &crit.CriuImage{Magic: magic}
	for _, m := range msgs {
		img.Entries = append(img.Entries, &crit.CriuEntry{Message: m})
	}
	if err := crit.New(nil, f, "", false, false).Encode(img); err != nil {
		t.Fatal(err)
	}
}

// mapAnon maps size bytes of private anonymous memory for the rest of the test.
func mapAnon(t *testing.T, size int, prot int) []byte {
	t.Helper()
	mem, err := unix.Mmap(-1, 0, size, prot, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Munmap(mem); err != nil {
			t.Errorf("unmap: %v", err)
		}
	})
	return mem
}

func entry(addr uintptr, pages int, flags uint32) *pagemap.PagemapEntry {
	return &pagemap.PagemapEntry{Vaddr: proto.Uint64(uint64(addr)), NrPages: proto.Uint32(uint32(pages)), Flags: proto.Uint32(flags)}
}

// An image of this test process whose pagemap holds, in CRIU's style, a 24 MiB run split in
// entries of 512 pages inside a writable private mapping, a small run, a run as long in a
// read-only mapping (zeros, a hole of the pages file) and a hole: Prepare takes only the
// long writable run out of the view CRIU gets, which keeps the rest byte for byte and its
// holes holes (a crafted image's 2 GiB of holes were written into TMPDIR as zeros, hostile
// test), and Fill writes it into this process.
func TestPrepareAndFillOwnMemory(t *testing.T) {
	const run = 24 << 20
	rw := mapAnon(t, run, unix.PROT_READ|unix.PROT_WRITE)
	ro := mapAnon(t, run, unix.PROT_READ)
	rwAt, roAt := uintptr(unsafe.Pointer(&rw[0])), uintptr(unsafe.Pointer(&ro[0]))
	pid := os.Getpid()

	r := rand.New(rand.NewPCG(7, 8))
	want := make([]byte, run)
	for i := range want {
		want[i] = byte(r.Uint32())
	}
	small := bytes.Repeat([]byte{7}, 4*criuimg.PageSize)
	roData := make([]byte, run)

	imageDir := t.TempDir()
	src := filepath.Join(imageDir, "criu")
	if err := os.Mkdir(src, 0o700); err != nil {
		t.Fatal(err)
	}
	var entries []proto.Message
	entries = append(entries, &pagemap.PagemapHead{PagesId: proto.Uint32(3)})
	entries = append(entries, entry(0x1000, 4, criuimg.PEPresent)) // small: stays with CRIU
	for off := 0; off < run; off += 512 * criuimg.PageSize {
		entries = append(entries, entry(rwAt+uintptr(off), 512, criuimg.PEPresent))
	}
	entries = append(entries, entry(roAt, run/criuimg.PageSize, criuimg.PEPresent)) // read-only: stays
	entries = append(entries, entry(0x7000000, 16, 1))                              // a hole in the parent
	encode(t, filepath.Join(src, criuimg.PagemapName(pid)), "PAGEMAP", entries...)
	vmas := []*vma.VmaEntry{
		{Start: proto.Uint64(0x1000), End: proto.Uint64(0x5000), Pgoff: proto.Uint64(0), Shmid: proto.Uint64(0),
			Prot: proto.Uint32(3), Flags: proto.Uint32(0x22), Status: proto.Uint32(vmaAnonPrivate | 1), Fd: proto.Int64(-1)},
		{Start: proto.Uint64(uint64(rwAt)), End: proto.Uint64(uint64(rwAt + run)), Pgoff: proto.Uint64(0), Shmid: proto.Uint64(0),
			Prot: proto.Uint32(3), Flags: proto.Uint32(0x22), Status: proto.Uint32(vmaAnonPrivate | 1), Fd: proto.Int64(-1)},
		{Start: proto.Uint64(uint64(roAt)), End: proto.Uint64(uint64(roAt + run)), Pgoff: proto.Uint64(0), Shmid: proto.Uint64(0),
			Prot: proto.Uint32(1), Flags: proto.Uint32(0x22), Status: proto.Uint32(vmaAnonPrivate | 1), Fd: proto.Int64(-1)},
	}
	zero := proto.Uint64(0)
	encode(t, filepath.Join(src, fmt.Sprintf("mm-%d.img", pid)), "MM", &mm.MmEntry{
		MmStartCode: zero, MmEndCode: zero, MmStartData: zero, MmEndData: zero, MmStartStack: zero, MmStartBrk: zero,
		MmBrk: zero, MmArgStart: zero, MmArgEnd: zero, MmEnvStart: zero, MmEnvEnd: zero, ExeFileId: proto.Uint32(1), Vmas: vmas})
	pages := append(append([]byte(nil), small...), want...)
	if err := os.WriteFile(filepath.Join(src, "pages-3.img"), pages, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(src, "pages-3.img"), int64(len(pages)+run)); err != nil { // roData, a hole
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "pstree.img"), []byte("other"), 0o600); err != nil {
		t.Fatal(err)
	}

	// The room the view needs is that of the pages CRIU keeps, not the whole file's: a
	// TMPDIR smaller than the run had the fill refused (review).
	if os.Geteuid() == 0 {
		small := t.TempDir()
		if err := unix.Mount("tmpfs", small, "tmpfs", 0, "size=2m"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Unmount(small, unix.MNT_DETACH) })
		if _, err := Prepare(imageDir, Dir(imageDir), small, &image.Manifest{Processes: []image.Process{{PID: pid}}}, []int{pid}); err != nil {
			t.Fatalf("Prepare into 2 MiB for 16 KiB of kept pages: %v", err)
		}
	}
	p, err := Prepare(imageDir, Dir(imageDir), t.TempDir(), &image.Manifest{Processes: []image.Process{{PID: pid}}}, []int{pid})
	if err != nil {
		t.Fatal(err)
	}
	if p.Bytes() != run {
		t.Fatalf("plan moves %d bytes, want the %d of the writable run", p.Bytes(), run)
	}
	if b, err := os.ReadFile(filepath.Join(p.Dir, "pstree.img")); err != nil || string(b) != "other" {
		t.Errorf("untouched file in the view: %q, %v", b, err)
	}
	kept, err := os.ReadFile(filepath.Join(p.Dir, "pages-3.img"))
	if err != nil || !bytes.Equal(kept, append(append([]byte(nil), small...), roData...)) {
		t.Errorf("CRIU's view of the page file: %d bytes, want the small and the read-only runs (%v)", len(kept), err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(p.Dir, "pages-3.img"), &st); err != nil || st.Blocks*512 > 1<<20 {
		t.Errorf("CRIU's view of the page file takes %d bytes of disk for %d of data: its hole was written (%v)", st.Blocks*512, len(small), err)
	}
	view, err := criuimg.ReadPagemap(filepath.Join(p.Dir, criuimg.PagemapName(pid)))
	if err != nil || len(view.Entries) != 3 || view.Entries[1].GetVaddr() != uint64(roAt) {
		t.Errorf("CRIU's view of the pagemap: %v (%v)", view, err)
	}

	count := new(meter.Counter)
	if err := p.Fill(meter.With(context.Background(), count)); err != nil {
		t.Fatal(err)
	}
	if done, total := count.Load(); done != run || total != run {
		t.Errorf("the fill counted %d of %d bytes, want %d of %d", done, total, run, run)
	}
	if !bytes.Equal(rw, want) {
		t.Fatal("the filled memory differs from the image's run")
	}
}

// Filling a process that is not there fails, naming it.
func TestFillFailsForAMissingProcess(t *testing.T) {
	f := filepath.Join(t.TempDir(), "pages")
	if err := os.WriteFile(f, make([]byte, criuimg.PageSize), 0o600); err != nil {
		t.Fatal(err)
	}
	p := &Plan{runs: []run{{pid: 1 << 22, addr: 0x10000, size: criuimg.PageSize, src: Dir(filepath.Dir(f)), file: filepath.Base(f)}}}
	if err := p.Fill(context.Background()); err == nil || !bytes.Contains([]byte(err.Error()), []byte("process 4194304")) {
		t.Fatalf("Fill = %v", err)
	}
}

// Ranges are saved in segments that, written back, give the range again.
func TestSegments(t *testing.T) {
	const size = maxSegment
	got := segments([]Range{{PID: 1, Start: 0x10000000, End: 0x10000000 + 2*size + 4096}, {PID: 2, Start: 0x5000, End: 0x6000, ImagePID: 7}}, size)
	want := []Range{
		{1, 0x10000000, 0x10000000 + size, 0},
		{1, 0x10000000 + size, 0x10000000 + 2*size, 0},
		{1, 0x10000000 + 2*size, 0x10000000 + 2*size + 4096, 0},
		{2, 0x5000, 0x6000, 7},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("segments = %v, want %v", got, want)
	}
}

// Segments are whole pieces, at least two per worker where the memory allows, at most maxSegment.
func TestSegmentSizeFor(t *testing.T) {
	for _, c := range []struct {
		total   uint64
		workers int
		want    uint64
	}{
		{16 << 30, 16, maxSegment},
		{1 << 30, 16, 32 << 20},
		{1 << 30, 2, maxSegment},
		{100 << 20, 16, image.HashChunkSize},
		{4096, 16, image.HashChunkSize},
		{3 << 30, 16, 96 << 20},
	} {
		if got := segmentSizeFor([]Range{{PID: 1, Start: 0, End: c.total}}, c.workers); got != c.want {
			t.Errorf("segmentSizeFor(%d bytes, %d workers) = %d, want %d", c.total, c.workers, got, c.want)
		}
	}
}

// Save reads a range of this process into a file whose checksum, computed as it was written,
// is the file's; a zero piece is left as a hole that reads back as zeros. With memory
// reserved ahead (on a tmpfs) the files are made from it, the zero piece's punched back to
// a hole, and nothing of the reserve is left in the image.
func TestSaveOwnMemory(t *testing.T) {
	for _, reserve := range []bool{false, true} {
		t.Run(fmt.Sprintf("reserve=%v", reserve), func(t *testing.T) {
			dir := t.TempDir()
			var res *Reserve
			if reserve {
				var err error
				if dir, err = os.MkdirTemp("/dev/shm", "gpucr-save-test-"); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { os.RemoveAll(dir) })
				if res = ReserveFor(dir, 2*maxSegment); res == nil {
					t.Fatal("no memory reserved on /dev/shm")
				}
				res.wg.Wait() // allocated before the save, as while the driver stages
			}
			saveOwnMemory(t, dir, res)
			if reserve {
				if _, err := os.Stat(filepath.Join(dir, reserveDir)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("the reserve is left in the image: %v", err)
				}
			}
		})
	}
}

func saveOwnMemory(t *testing.T, dir string, res *Reserve) {
	const size = 3*image.HashChunkSize + 4096
	mem := mapAnon(t, size, unix.PROT_READ|unix.PROT_WRITE)
	r := rand.New(rand.NewPCG(9, 10))
	for i := range mem {
		if i < image.HashChunkSize || i >= 2*image.HashChunkSize { // the second piece stays zero
			mem[i] = byte(r.Uint32())
		}
	}
	start := uint64(uintptr(unsafe.Pointer(&mem[0])))
	count := new(meter.Counter)
	files, err := Save(meter.With(context.Background(), count), dir, []Range{{PID: os.Getpid(), Start: start, End: start + size}}, res)
	if err != nil {
		t.Fatal(err)
	}
	// The zero piece is counted too: it is done, as a hole.
	if done, total := count.Load(); done != size || total != size {
		t.Errorf("the save counted %d of %d bytes, want %d of %d", done, total, size, size)
	}
	if len(files) != 4 { // pieces of HashChunkSize: one file each, as the memory is small
		t.Fatalf("files %+v", files)
	}
	if err := image.CheckSums(dir, files); err != nil {
		t.Fatalf("the checksum computed while saving is not the file's: %v", err)
	}
	m := &image.Manifest{Processes: []image.Process{{PID: os.Getpid()}}, Files: files}
	runs, err := savedRuns(m, Dir(dir))
	if err != nil || len(runs) != len(files) {
		t.Fatalf("savedRuns = %+v, %v", runs, err)
	}
	slices.SortFunc(runs, func(a, b run) int { return cmp.Compare(a.addr, b.addr) })
	var got []byte
	for i, r := range runs {
		if r.pid != os.Getpid() || r.addr != start+uint64(len(got)) || (i < len(runs)-1 && r.size != image.HashChunkSize) {
			t.Fatalf("run %d = %+v: the runs do not cover the range in pieces", i, r)
		}
		b := make([]byte, r.size)
		if err := r.src.ReadPiece(context.Background(), r.file, 0, b, func(int, []byte) error { return nil }); err != nil {
			t.Fatal(err)
		}
		got = append(got, b...)
		// The zero piece holds no memory, whether its file came from the reserve or not.
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(dir, r.file), &st); err != nil {
			t.Fatal(err)
		}
		if i == 1 && st.Blocks != 0 {
			t.Errorf("the zero piece's file holds %d blocks, want a hole", st.Blocks)
		}
	}
	if !bytes.Equal(got, mem) {
		t.Fatal("saved files differ from the memory")
	}
}

// collected is a memory file SaveTo streams, kept whole.
type collected struct {
	mu   *sync.Mutex
	data map[string][]byte
	path string
}

func (c collected) Receive(addr uint64, size int, r io.Reader) error {
	b := make([]byte, size)
	if _, err := io.ReadFull(r, b); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if int(addr) != len(c.data[c.path]) {
		return fmt.Errorf("%s: bytes at %d after %d", c.path, addr, len(c.data[c.path]))
	}
	c.data[c.path] = append(c.data[c.path], b...)
	return nil
}

func (collected) Close() error { return nil }

// SaveTo streams every byte of the ranges, and counts them as it goes.
func TestSaveToStreamsAndCounts(t *testing.T) {
	const size = 2*image.HashChunkSize + 8192
	mem := mapAnon(t, size, unix.PROT_READ|unix.PROT_WRITE)
	r := rand.New(rand.NewPCG(11, 12))
	for i := range mem {
		mem[i] = byte(r.Uint32())
	}
	start := uint64(uintptr(unsafe.Pointer(&mem[0])))
	got := collected{mu: new(sync.Mutex), data: map[string][]byte{}}
	count := new(meter.Counter)
	err := SaveTo(meter.With(context.Background(), count), []Range{{PID: os.Getpid(), Start: start, End: start + size}},
		func(path string) (criuimg.Receiver, error) { c := got; c.path = path; return c, nil })
	if err != nil {
		t.Fatal(err)
	}
	if done, total := count.Load(); done != size || total != size {
		t.Errorf("the save counted %d of %d bytes, want %d of %d", done, total, size, size)
	}
	at := map[uint64][]byte{}
	for p, b := range got.data {
		pid, start, ok := criuimg.ParseMemName(filepath.Base(p))
		if !ok || pid != os.Getpid() {
			t.Fatalf("file %s does not name this process's memory", p)
		}
		at[start] = b
	}
	var all []byte
	for _, a := range slices.Sorted(maps.Keys(at)) {
		if a != start+uint64(len(all)) {
			t.Fatalf("a file starts at %#x, want %#x", a, start+uint64(len(all)))
		}
		all = append(all, at[a]...)
	}
	if !bytes.Equal(all, mem) {
		t.Fatal("the streamed files differ from the memory")
	}
}

// Select finds a large resident writable private mapping of this process, and not a small one.
func TestSelectOwnMemory(t *testing.T) {
	const size = 32 << 20
	mem := mapAnon(t, size, unix.PROT_READ|unix.PROT_WRITE)
	for i := 0; i < size; i += criuimg.PageSize {
		mem[i] = 1
	}
	start := uint64(uintptr(unsafe.Pointer(&mem[0])))
	rs, err := Select([]proctree.Process{{PID: os.Getpid()}})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range rs {
		if r.Start <= start && start+size <= r.End {
			found = true
		}
		if r.End-r.Start < MinRun {
			t.Errorf("selected a mapping smaller than MinRun: %+v", r)
		}
	}
	if !found {
		t.Fatalf("the 32 MiB mapping at %#x is not among %+v", start, rs)
	}
}

// A process of the tree that exited since the tree was read (a short-lived child) has no
// memory to choose: a checkpoint of a shell loop's tree failed every other time on it.
func TestSelectPassesOverAProcessThatExited(t *testing.T) {
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	if _, err := Select([]proctree.Process{{PID: os.Getpid()}, {PID: gone.Process.Pid, PPID: os.Getpid()}}); err != nil {
		t.Fatalf("Select of a tree with a process that exited: %v", err)
	}
}

// A process gives up a mapping that a descendant maps too: here a 32 MiB mapping of this
// process laid over the address of a child's stack.
func TestSelectLeavesWhatAChildMapsToCRIU(t *testing.T) {
	child := testutil.StartSleeper(t)
	maps, err := proctree.ReadMaps(fmt.Sprintf("/proc/%d/maps", child.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	var stack uint64
	for _, m := range maps {
		if m.Path == "[stack]" {
			stack = m.Start
		}
	}
	const size = 32 << 20
	at := stack&^(2<<20-1) - size/2
	// MAP_POPULATE makes it resident without this test touching it.
	addr, _, errno := unix.Syscall6(unix.SYS_MMAP, uintptr(at), size, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED_NOREPLACE|unix.MAP_POPULATE, ^uintptr(0), 0)
	if errno != 0 || addr != uintptr(at) || stack == 0 {
		t.Skipf("cannot map over the child's stack at %#x here: %v", at, errno)
	}
	t.Cleanup(func() {
		if _, _, errno := unix.Syscall(unix.SYS_MUNMAP, addr, size, 0); errno != 0 {
			t.Errorf("unmap: %v", errno)
		}
	})
	has := func(rs []Range) bool {
		return slices.ContainsFunc(rs, func(r Range) bool { return r.Start < at+size && at < r.End })
	}
	self := proctree.Process{PID: os.Getpid()}
	alone, err := Select([]proctree.Process{self})
	if err != nil || !has(alone) {
		t.Fatalf("without the child: %v, %+v does not hold the mapping at %#x", err, alone, at)
	}
	withChild, err := Select([]proctree.Process{self, {PID: child.Process.Pid, PPID: self.PID}})
	if err != nil || has(withChild) {
		t.Fatalf("with the child mapping the same addresses: %v, %+v holds the mapping at %#x", err, withChild, at)
	}
}

// Save holds no descriptor per range: 300 ranges save under a limit of 64 open files.
func TestSaveManyRangesUnderALowFileLimit(t *testing.T) {
	const n = 300
	mem := mapAnon(t, 2*n*criuimg.PageSize, unix.PROT_READ|unix.PROT_WRITE)
	start := uint64(uintptr(unsafe.Pointer(&mem[0])))
	var rs []Range
	for i := range n { // every other page, so that no two ranges touch
		mem[2*i*criuimg.PageSize] = byte(i + 1)
		a := start + uint64(2*i*criuimg.PageSize)
		rs = append(rs, Range{PID: os.Getpid(), Start: a, End: a + criuimg.PageSize})
	}
	var files []image.File
	var err error
	testutil.WithFileLimit(t, 64, func() { files, err = Save(context.Background(), t.TempDir(), rs, nil) })
	if err != nil || len(files) != n {
		t.Fatalf("Save of %d ranges with 64 descriptors: %d files, %v", n, len(files), err)
	}
}

// Renumbering maps every run's process, or names the one it cannot.
func TestRenumber(t *testing.T) {
	q := &Plan{runs: []run{{pid: 5, addr: 0x1000, size: 4096, src: Dir("/img"), file: "mem/5-1000.img"}}}
	if err := q.Renumber(map[int]int{6: 60}); err == nil || !strings.Contains(err.Error(), "process 5") {
		t.Errorf("Renumber without process 5: %v", err)
	}
	if err := q.Renumber(map[int]int{5: 50}); err != nil || q.runs[0].pid != 50 {
		t.Errorf("Renumber: %v, runs %+v", err, q.runs)
	}
}

// badSource serves its bytes and then, asked, says they were not the image's.
type badSource struct{ data []byte }

func (s badSource) ReadPiece(_ context.Context, _ string, off int64, p []byte, use func(int, []byte) error) error {
	copy(p, s.data[off:])
	return use(0, p)
}
func (badSource) Verify() error { return image.ErrCorrupt }

// A source that finds, once everything was read, that it was not the image's fails the
// fill: the engine's gate then has CRIU kill the tasks before any resumes.
func TestFillFailsWhenItsSourceDoesNotVerify(t *testing.T) {
	mem, err := unix.Mmap(-1, 0, criuimg.PageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unix.Munmap(mem) }()
	src := badSource{bytes.Repeat([]byte{5}, criuimg.PageSize)}
	p := &Plan{runs: []run{{pid: os.Getpid(), addr: uint64(uintptr(unsafe.Pointer(&mem[0]))), size: criuimg.PageSize, src: src, file: "mem/x.img"}}}
	if err := p.Fill(context.Background()); !errors.Is(err, image.ErrCorrupt) {
		t.Fatalf("Fill = %v, want the source's verdict", err)
	}
	if !bytes.Equal(mem, src.data) {
		t.Fatal("the fill did not write what the source served")
	}
}

// A restore writes only what the manifest lists, into processes of the image's tree, at
// memory the process has: a crafted image naming another process, or an address the
// restored process does not map, is refused before anything is written.
func TestFillRefusesWhatTheImageDoesNotOwn(t *testing.T) {
	mem := mapAnon(t, criuimg.PageSize, unix.PROT_READ|unix.PROT_WRITE)
	start := uint64(uintptr(unsafe.Pointer(&mem[0])))
	dir := t.TempDir()
	files, err := Save(context.Background(), dir, []Range{{PID: os.Getpid(), Start: start, End: start + criuimg.PageSize}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	other := &image.Manifest{Processes: []image.Process{{PID: os.Getpid() + 1}}, Files: files}
	if _, err := savedRuns(other, Dir(dir)); err == nil || !strings.Contains(err.Error(), "not in the image's tree") {
		t.Fatalf("a range of a process outside the tree: savedRuns = %v", err)
	}
	// A file in mem/ that the manifest does not list is never read.
	if err := os.WriteFile(filepath.Join(dir, criuimg.MemDir, "1-1000.img"), make([]byte, criuimg.PageSize), 0o600); err != nil {
		t.Fatal(err)
	}
	own := &image.Manifest{Processes: []image.Process{{PID: os.Getpid()}}, Files: files}
	runs, err := savedRuns(own, Dir(dir))
	if err != nil || len(runs) != 1 {
		t.Fatalf("savedRuns = %+v, %v; want the one listed range", runs, err)
	}
	if err := (&Plan{runs: runs}).Fill(context.Background()); err != nil {
		t.Fatalf("a mapped range: %v", err)
	}
	if err := unix.Mprotect(mem, unix.PROT_READ); err != nil {
		t.Fatal(err)
	}
	err = (&Plan{runs: runs}).Fill(context.Background())
	if err == nil || !strings.Contains(err.Error(), "no writable private memory") {
		t.Fatalf("a read-only range: Fill = %v", err)
	}
	// A file mapped shared at the range: a write there would land in the file.
	shared := filepath.Join(t.TempDir(), "shared")
	if err := os.WriteFile(shared, make([]byte, criuimg.PageSize), 0o600); err != nil {
		t.Fatal(err)
	}
	mapSharedOver(t, mem, shared)
	err = (&Plan{runs: runs}).Fill(context.Background())
	if b, _ := os.ReadFile(shared); err == nil || !strings.Contains(err.Error(), "no writable private memory") || !bytes.Equal(b, make([]byte, criuimg.PageSize)) {
		t.Fatalf("a range mapped shared from a file: Fill = %v, the file changed %v", err, !bytes.Equal(b, make([]byte, criuimg.PageSize)))
	}
	runs[0].addr = 4096 // nothing is mapped at the second page of the address space
	err = (&Plan{runs: runs}).Fill(context.Background())
	if err == nil || !strings.Contains(err.Error(), "no writable private memory") {
		t.Fatalf("an unmapped range: Fill = %v", err)
	}
}

// Runs gpucr saved are whole pages, each page in one: a crafted image's run moved by a byte,
// or a page into the run before it, was filled so, and the restore said it succeeded.
func TestSavedRunsAreWholePagesOnce(t *testing.T) {
	m := &image.Manifest{Processes: []image.Process{{PID: 7}}}
	file := func(name string, size int64) image.File {
		return image.File{Path: criuimg.MemDir + "/" + name, Size: size}
	}
	for name, files := range map[string][]image.File{
		"unaligned start":      {file("7-100001.img", 1<<20)},
		"part of a page":       {file("7-100000.img", 4097)},
		"overlapping runs":     {file("7-100000.img", 1<<20), file("7-1ff000.img", 1<<20)},
		"one run listed twice": {file("7-100000.img", 1<<20), file("7-0100000.img", 1<<20)},
	} {
		m.Files = files
		if _, err := savedRuns(m, Dir(t.TempDir())); !errors.Is(err, image.ErrCorrupt) {
			t.Errorf("%s: savedRuns = %v, want the image refused as corrupt", name, err)
		}
	}
	m.Files = []image.File{file("7-100000.img", 1<<20), file("7-200000.img", 1<<20)}
	if runs, err := savedRuns(m, Dir(t.TempDir())); err != nil || len(runs) != 2 {
		t.Fatalf("two runs side by side: %+v, %v", runs, err)
	}
}

// A pagemap listing so many pages that their byte count wraps around to exactly 2^64 —
// and so matches an empty pages file — is refused, not summed: 2^20 entries of 2^32-1
// pages and one of 2^20 pages make 2^64 bytes.
func TestCheckPagesRefusesAWrappingSum(t *testing.T) {
	dir := t.TempDir()
	entries := make([]*pagemap.PagemapEntry, 1<<20, 1<<20+1)
	for i := range entries {
		entries[i] = entry(0, math.MaxUint32, criuimg.PEPresent)
	}
	entries = append(entries, entry(0, 1<<20, criuimg.PEPresent))
	if err := criuimg.WritePagemap(filepath.Join(dir, "pagemap-1.img"), &criuimg.Pagemap{Head: &pagemap.PagemapHead{PagesId: proto.Uint32(1)}, Entries: entries}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pages-1.img"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	err := CheckPages(dir)
	if !errors.Is(err, image.ErrCorrupt) || !strings.Contains(err.Error(), "more pages than any file holds") {
		t.Fatalf("CheckPages: %v", err)
	}
}

// An entry without flags, as a CRIU older than them wrote it, is present unless it is in
// the parent image: CRIU reads its pages from the pages file, so CheckPages counts them too.
// Otherwise a crafted image whose pages file leaves them out would pass, and CRIU would
// spin on its short pages file.
func TestCheckPagesReadsEntriesWithoutFlagsAsCRIUDoes(t *testing.T) {
	noFlags := &pagemap.PagemapEntry{Vaddr: proto.Uint64(0x1000), NrPages: proto.Uint32(2)}
	inParent := &pagemap.PagemapEntry{Vaddr: proto.Uint64(0x8000), NrPages: proto.Uint32(4), InParent: proto.Bool(true)}
	for _, tc := range []struct {
		pages int64 // the pages file's size; -1: none
		ok    bool
	}{
		{-1, false},
		{0, false},
		{2 * criuimg.PageSize, true},
		{6 * criuimg.PageSize, false},
	} {
		dir := t.TempDir()
		pm := &criuimg.Pagemap{Head: &pagemap.PagemapHead{PagesId: proto.Uint32(1)}, Entries: []*pagemap.PagemapEntry{noFlags, inParent}}
		if err := criuimg.WritePagemap(filepath.Join(dir, "pagemap-1.img"), pm); err != nil {
			t.Fatal(err)
		}
		if tc.pages >= 0 {
			if err := os.WriteFile(filepath.Join(dir, "pages-1.img"), make([]byte, tc.pages), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := CheckPages(dir); (err == nil) != tc.ok {
			t.Errorf("a pages file of %d bytes: CheckPages = %v, want ok %v", tc.pages, err, tc.ok)
		}
	}
}

// killingSource, before it serves its piece, lets the process the fill writes into die
// and puts another at its PID.
type killingSource struct {
	t    *testing.T
	pid  int
	data []byte
}

func (s killingSource) ReadPiece(_ context.Context, _ string, off int64, p []byte, use func(int, []byte) error) error {
	testutil.KillAndReap(s.pid)
	testutil.StartAt(s.t, s.pid, "sleep", "100")
	copy(p, s.data[off:])
	return use(0, p)
}
func (killingSource) Verify() error { return nil }

// A restored process that dies during the fill is written no more: its PID may be another
// process's by then, and a hostile test had the image's memory written, as root, into the
// process that took it.
func TestFillStopsAtAProcessThatExited(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: places a process at a PID")
	}
	target := testutil.StartSleeper(t)
	maps, err := proctree.ReadMaps(fmt.Sprintf("/proc/%d/maps", target.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(maps, func(m proctree.Mapping) bool { return m.Path == "[stack]" })
	if i < 0 {
		t.Fatal("the target has no stack mapping")
	}
	src := killingSource{t, target.Process.Pid, bytes.Repeat([]byte{7}, criuimg.PageSize)}
	p := &Plan{runs: []run{{pid: target.Process.Pid, addr: maps[i].Start, size: criuimg.PageSize, src: src, file: "mem/x.img"}}}
	if err := p.Fill(context.Background()); err == nil || !strings.Contains(err.Error(), "exited during the fill") {
		t.Fatalf("Fill into a process that died meanwhile = %v, want it named as exited", err)
	}
}

// The ranges are chosen before CRIU freezes the tree: part of one made read-only in between
// was saved and left out of CRIU's dump, and the restore's fill refused it for good
// (review). The save checks them again once frozen, and fails the checkpoint.
func TestSaveRefusesARangeNoLongerWritable(t *testing.T) {
	const size = 2 * image.HashChunkSize
	mem := mapAnon(t, size, unix.PROT_READ|unix.PROT_WRITE)
	start := uint64(uintptr(unsafe.Pointer(&mem[0])))
	rs := []Range{{PID: os.Getpid(), Start: start, End: start + size}}
	if err := unix.Mprotect(mem[image.HashChunkSize:], unix.PROT_READ); err != nil {
		t.Fatal(err)
	}
	if _, err := Save(context.Background(), t.TempDir(), rs, nil); err == nil || !strings.Contains(err.Error(), "no longer all writable") {
		t.Errorf("Save = %v, want the range refused", err)
	}
	err := SaveTo(context.Background(), rs, func(string) (criuimg.Receiver, error) { return nil, errors.New("nothing may be stored") })
	if err == nil || !strings.Contains(err.Error(), "no longer all writable") {
		t.Errorf("SaveTo = %v, want the range refused", err)
	}
}

// A range a thread mapped a file shared over between the choice and the freeze had the
// file's bytes saved as the process's memory, and the restore wrote them back into the file
// through the restored shared mapping (review): the save refuses it.
func TestSaveRefusesARangeMappedSharedMeanwhile(t *testing.T) {
	const size = 2 * image.HashChunkSize
	mem := mapAnon(t, size, unix.PROT_READ|unix.PROT_WRITE)
	start := uint64(uintptr(unsafe.Pointer(&mem[0])))
	rs := []Range{{PID: os.Getpid(), Start: start, End: start + size}}
	shared := filepath.Join(t.TempDir(), "shared")
	if err := os.WriteFile(shared, make([]byte, image.HashChunkSize), 0o600); err != nil {
		t.Fatal(err)
	}
	mapSharedOver(t, mem[image.HashChunkSize:], shared)
	if _, err := Save(context.Background(), t.TempDir(), rs, nil); err == nil || !strings.Contains(err.Error(), "no longer all writable private memory") {
		t.Errorf("Save = %v, want the range refused", err)
	}
}

// mapSharedOver maps the file at path shared, writable, over mem.
func mapSharedOver(t *testing.T, mem []byte, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, _, errno := unix.Syscall6(unix.SYS_MMAP, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)),
		unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED, f.Fd(), 0)
	if errno != 0 {
		t.Fatal(errno)
	}
}
