package memfill

import (
	"encoding/binary"
	"errors"
	"math"
	"math/bits"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/mm"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pagemap"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/vma"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/fuzzcheck"
	"github.com/gpucr/gpucr/internal/image"
)

func vmaEntry(start, end uint64, prot, status uint32) *vma.VmaEntry {
	return &vma.VmaEntry{Start: proto.Uint64(start), End: proto.Uint64(end), Pgoff: proto.Uint64(0), Shmid: proto.Uint64(0),
		Prot: proto.Uint32(prot), Flags: proto.Uint32(0x22), Status: proto.Uint32(status), Fd: proto.Int64(-1)}
}

func mmBytes(t testing.TB, vmas ...*vma.VmaEntry) []byte {
	zero := proto.Uint64(0)
	return fuzzcheck.Image(t, "MM", &mm.MmEntry{
		MmStartCode: zero, MmEndCode: zero, MmStartData: zero, MmEndData: zero, MmStartStack: zero, MmStartBrk: zero,
		MmBrk: zero, MmArgStart: zero, MmArgEnd: zero, MmEnvStart: zero, MmEnvEnd: zero, ExeFileId: proto.Uint32(1), Vmas: vmas})
}

// presentBytes is how many bytes of pages file entries account for; ok is false when the
// sum does not fit in 64 bits.
func presentBytes(entries []*pagemap.PagemapEntry) (total uint64, ok bool) {
	for _, e := range entries {
		if !criuimg.Present(e) {
			continue
		}
		var carry uint64
		total, carry = bits.Add64(total, uint64(e.GetNrPages())*criuimg.PageSize, 0)
		if carry != 0 {
			return 0, false
		}
	}
	return total, true
}

// sampleEntries is a pagemap as CRIU writes one: present runs, a run CRIU left in the
// parent image, a lazy run.
func sampleEntries() []*pagemap.PagemapEntry {
	return []*pagemap.PagemapEntry{
		entry(0x400000, 4, criuimg.PEPresent),
		entry(0x600000, 2, 1),
		entry(0x7f0000000000, 512, criuimg.PEPresent),
		entry(0x7f0000200000, 512, criuimg.PEPresent),
		entry(0x7fff00000000, 8, 2),
	}
}

// A pagemap comes from the image. CheckPages refuses one that does not read, and accepts a
// pages file exactly as long as the pagemap's present pages, no other.
func FuzzCheckPages(f *testing.F) {
	good := fuzzcheck.Pagemap(f, 3, sampleEntries()...)
	f.Add(good)
	f.Add(fuzzcheck.Pagemap(f, 1))
	f.Add(fuzzcheck.Pagemap(f, 7, &pagemap.PagemapEntry{Vaddr: proto.Uint64(0x1000), NrPages: proto.Uint32(1)})) // no flags
	f.Add(fuzzcheck.Pagemap(f, 1, entry(0x1000, math.MaxUint32, criuimg.PEPresent)))
	f.Add(good[:8])
	f.Add(good[:len(good)-2])
	f.Add(append(slices.Clone(good[:8]), 0xfe, 0xff, 0xff, 0xff, 8, 1))
	f.Add([]byte{})
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		criuDir := filepath.Join(dir, "criu")
		if err := os.RemoveAll(criuDir); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(criuDir, 0o700); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(criuDir, "pagemap-1.img")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		pm, err := criuimg.ReadPagemap(path)
		if err != nil {
			if CheckPages(criuDir) == nil {
				t.Fatalf("CheckPages accepted a pagemap ReadPagemap refuses (%v)", err)
			}
			return
		}
		want, ok := presentBytes(pm.Entries)
		if !ok || want > 1<<40 {
			return // no file that long to try
		}
		pages := filepath.Join(criuDir, pm.PagesName())
		if want == 0 {
			if err := CheckPages(criuDir); err != nil {
				t.Fatalf("no present pages and no pages file: %v", err)
			}
		}
		for _, size := range []int64{int64(want), int64(want) + criuimg.PageSize, int64(want) - 1} {
			if size < 0 {
				continue
			}
			if err := os.WriteFile(pages, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(pages, size); err != nil {
				t.Fatal(err)
			}
			err := CheckPages(criuDir)
			switch {
			case size == int64(want) && err != nil:
				t.Fatalf("a pages file of the %d bytes the pagemap lists: %v", want, err)
			case size != int64(want) && !errors.Is(err, image.ErrCorrupt):
				t.Fatalf("a pages file of %d bytes where the pagemap lists %d: %v", size, want, err)
			}
		}
	})
}

// splitLimit bounds the pages file FuzzSplit gives split to cut: the kept pages are copied.
const splitLimit = 24 << 20

// split rewrites CRIU's view of a process's memory from the image's pagemap and mm. Whatever
// those hold, it fails or leaves a view that adds up: every run it takes is at least MinRun
// bytes, inside one writable private anonymous mapping, and out of the pages file; the
// rewritten pagemap lists exactly the other entries, in order, and accounts for the
// rewritten pages file exactly (what CheckPages demands), whose pages are the kept ones.
func FuzzSplit(f *testing.F) {
	const rw, ro, anon = 3, 1, vmaAnonPrivate | 1
	var big []*pagemap.PagemapEntry
	big = append(big, entry(0x1000, 4, criuimg.PEPresent))
	for off := uintptr(0); off < 20<<20; off += 512 * criuimg.PageSize {
		big = append(big, entry(0x10000000+off, 512, criuimg.PEPresent))
	}
	big = append(big, entry(0x7000000, 16, 1))
	bigMM := mmBytes(f, vmaEntry(0x1000, 0x5000, rw, anon), vmaEntry(0x10000000, 0x10000000+24<<20, rw, anon))
	f.Add(fuzzcheck.Pagemap(f, 3, big...), bigMM)
	f.Add(fuzzcheck.Pagemap(f, 3, big...), mmBytes(f, vmaEntry(0x10000000, 0x10000000+24<<20, ro, anon)))
	f.Add(fuzzcheck.Pagemap(f, 3, entry(0x10000000, 4096, criuimg.PEPresent), entry(0x10000000+16<<20, 1, criuimg.PEPresent)), bigMM)
	f.Add(fuzzcheck.Pagemap(f, 3, entry(0xfffffffffffff000, 4096, criuimg.PEPresent)), mmBytes(f, vmaEntry(0xffffffffff000000, math.MaxUint64, rw, anon)))
	f.Add(fuzzcheck.Pagemap(f, 3, sampleEntries()...), mmBytes(f))
	f.Add(fuzzcheck.Pagemap(f, 3, big...), fuzzcheck.Pagemap(f, 1))
	// The long run as a CRIU older than the flags wrote it: present all the same.
	var old []*pagemap.PagemapEntry
	for _, e := range big {
		if e.GetFlags() == criuimg.PEPresent {
			e = &pagemap.PagemapEntry{Vaddr: e.Vaddr, NrPages: e.NrPages}
		}
		old = append(old, e)
	}
	f.Add(fuzzcheck.Pagemap(f, 3, old...), bigMM)
	f.Add([]byte{}, []byte{})
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, pm, mmData []byte) {
		criuDir := filepath.Join(dir, "criu")
		if err := os.RemoveAll(criuDir); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(criuDir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(criuDir, "pagemap-1.img"), pm, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(criuDir, "mm-1.img"), mmData, 0o600); err != nil {
			t.Fatal(err)
		}
		var head *pagemap.PagemapHead
		var entries []*pagemap.PagemapEntry
		read, err := criuimg.ReadPagemap(filepath.Join(criuDir, "pagemap-1.img"))
		if err == nil {
			head, entries = read.Head, read.Entries
		}
		total, ok := presentBytes(entries)
		if err == nil && (!ok || total > splitLimit) {
			return
		}
		// The pages file: holes, and at the start of each entry's pages its index, so that
		// the rewritten file shows which pages it kept.
		offsets := make([]int64, len(entries))
		pagesName := criuimg.PagesName(head.GetPagesId())
		if err == nil {
			pf, err := os.Create(filepath.Join(criuDir, pagesName))
			if err != nil {
				t.Fatal(err)
			}
			var off int64
			for i, e := range entries {
				offsets[i] = off
				if !criuimg.Present(e) || e.GetNrPages() == 0 {
					continue
				}
				if _, err := pf.WriteAt(binary.LittleEndian.AppendUint64(nil, uint64(i+1)), off); err != nil {
					t.Fatal(err)
				}
				off += int64(e.GetNrPages()) * criuimg.PageSize
			}
			if err := pf.Truncate(int64(total)); err != nil {
				t.Fatal(err)
			}
			pf.Close()
		}

		out := t.TempDir()
		p := &Plan{Dir: out}
		runs, files, err := p.split(criuDir, out, 1)
		if err != nil {
			return
		}
		if len(runs) == 0 {
			if files != nil {
				t.Fatalf("no runs taken, yet %v rewritten", files)
			}
			return
		}
		if !slices.Equal(files, []string{"pagemap-1.img", pagesName}) {
			t.Fatalf("rewrote %v", files)
		}
		writable, err := WritableAnon(filepath.Join(criuDir, "mm-1.img"))
		if err != nil {
			t.Fatalf("split took runs, but the mm image does not read: %v", err)
		}
		var taken uint64
		for _, r := range runs {
			switch {
			case r.pid != 1 || r.src != Dir(criuDir) || r.file != pagesName:
				t.Fatalf("run %+v: not of process 1's pages file", r)
			case r.size < MinRun || r.size%criuimg.PageSize != 0 || r.off < 0 || r.off%criuimg.PageSize != 0 || uint64(r.off+r.size) > total:
				t.Fatalf("run %+v: not whole pages of at least MinRun in a %d-byte pages file", r, total)
			case r.addr+uint64(r.size) < r.addr:
				t.Fatalf("run %+v: past the end of the address space", r)
			case !writable(r.addr, uint64(r.size)):
				t.Fatalf("run %+v: not in one writable private anonymous mapping", r)
			}
			taken += uint64(r.size)
		}
		// Entries with pages in a run leave the pagemap, the others stay in order; a present
		// entry of no pages may go either way, with the run it borders.
		inRun := func(i int) bool {
			return slices.ContainsFunc(runs, func(r run) bool { return offsets[i] >= r.off && offsets[i] < r.off+r.size })
		}
		rewritten, err := criuimg.ReadPagemap(filepath.Join(out, "pagemap-1.img"))
		if err != nil || !proto.Equal(head, rewritten.Head) {
			t.Fatalf("rewritten pagemap: %v, %v; want the head %v", rewritten, err, head)
		}
		entries2 := rewritten.Entries
		view, err := os.ReadFile(filepath.Join(out, pagesName))
		if err != nil {
			t.Fatal(err)
		}
		var j int
		var off int64
		for i, e := range entries {
			present := criuimg.Present(e)
			switch {
			case present && e.GetNrPages() > 0 && inRun(i):
				continue
			case present && e.GetNrPages() == 0:
				if j < len(entries2) && proto.Equal(entries2[j], e) {
					j++
				}
				continue
			}
			if j >= len(entries2) || !proto.Equal(entries2[j], e) {
				t.Fatalf("entry %d, %v, is outside the runs %+v but not next in the rewritten pagemap", i, e, runs)
			}
			j++
			if !present {
				continue
			}
			if off+8 > int64(len(view)) || binary.LittleEndian.Uint64(view[off:]) != uint64(i+1) {
				t.Fatalf("the rewritten pages file at %d does not hold entry %d's pages", off, i)
			}
			off += int64(e.GetNrPages()) * criuimg.PageSize
		}
		if j != len(entries2) {
			t.Fatalf("the rewritten pagemap has %d entries more than the image's outside the runs", len(entries2)-j)
		}
		if off != int64(len(view)) || uint64(off)+taken != total {
			t.Fatalf("rewritten pages file: %d bytes, its pagemap lists %d; runs take %d of %d", len(view), off, taken, total)
		}
		if err := CheckPages(out); err != nil {
			t.Fatalf("CheckPages refuses the rewritten view: %v", err)
		}
	})
}

// The names of the files in mem/ come from the image's manifest: savedRuns turns each into a
// run of one of the image's processes, inside the address space, or refuses it; and every
// name Save gives a range of whole pages reads back as that range.
func FuzzSavedRuns(f *testing.F) {
	f.Add("42-7f0000000000.img", int64(16<<20), 42, uint64(0x7f0000000000))
	f.Add("42-0.img", int64(0), 42, uint64(0))
	f.Add("43-1000.img", int64(4096), 42, uint64(0x1000))
	f.Add("42-ffffffffffffffff.img", int64(1), 42, uint64(math.MaxUint64))
	f.Add("0", int64(3991), 42, uint64(4090)) // a run of no whole pages (the fuzzer's, 2026-11-29)
	f.Add("42-1000", int64(4096), 42, uint64(0x1000))
	f.Add("+42-1000.img", int64(4096), 42, uint64(0x1000))
	f.Add("42-0x1000.img", int64(4096), 42, uint64(0x1000))
	f.Add("sub/42-1000.img", int64(4096), 42, uint64(0x1000))
	f.Add("-1000.img", int64(4096), 42, uint64(0x1000))
	f.Fuzz(func(t *testing.T, name string, size int64, pid int, start uint64) {
		// image.Load refuses negative sizes and PIDs before a restore reads the files.
		if size < 0 || pid <= 0 {
			return
		}
		src := Dir("/img")
		m := &image.Manifest{Processes: []image.Process{{PID: pid}}, Files: []image.File{{Path: criuimg.MemDir + "/" + name, Size: size}}}
		runs, err := savedRuns(m, src)
		if err != nil {
			if !errors.Is(err, image.ErrCorrupt) {
				t.Fatalf("savedRuns(%q) = %v, not an ErrCorrupt", name, err)
			}
		} else {
			for _, r := range runs {
				switch {
				case r.pid != pid:
					t.Fatalf("%q: a run of process %d, which is not in the image", name, r.pid)
				case r.size != size || r.addr+uint64(r.size) < r.addr:
					t.Fatalf("%q of %d bytes: run %+v", name, size, r)
				case r.src != src || r.file != criuimg.MemDir+"/"+name:
					t.Fatalf("%q: run reads %s of %v", name, r.file, r.src)
				}
				back, err := savedRuns(&image.Manifest{Processes: m.Processes,
					Files: []image.File{{Path: criuimg.MemDir + "/" + criuimg.MemName(r.pid, r.addr), Size: size}}}, src)
				if err != nil || len(back) != 1 || back[0].pid != r.pid || back[0].addr != r.addr {
					t.Fatalf("%q: the run's own name reads back as %+v, %v", name, back, err)
				}
			}
		}

		// The name Save gives the range (pid, start).
		own := criuimg.MemName(pid, start)
		runs, err = savedRuns(&image.Manifest{Processes: m.Processes, Files: []image.File{{Path: criuimg.MemDir + "/" + own, Size: size}}}, src)
		fits := start+uint64(size) >= start && start%criuimg.PageSize == 0 && size%criuimg.PageSize == 0
		if fits != (err == nil) {
			t.Fatalf("%s of %d bytes: savedRuns = %v", own, size, err)
		}
		if fits && (len(runs) != 1 || runs[0].pid != pid || runs[0].addr != start || runs[0].size != size) {
			t.Fatalf("%s of %d bytes read back as %+v", own, size, runs)
		}
	})
}
