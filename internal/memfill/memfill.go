// Package memfill moves the large runs of a process's memory outside CRIU, in parallel:
// saved at checkpoint (Select, Save), written back at restore (Prepare, Fill).
//
// CRIU restores memory on one thread per process, copying every page from the page file
// into freshly faulted memory: for a GPU process, whose device memory the driver staged
// into host memory, that copy is most of the restore. memfill gives CRIU a view of the
// image whose pagemaps leave out the large runs of writable private anonymous memory (CRIU
// then maps them empty), and, once CRIU has restored the tree and before any task resumes,
// writes those runs into the processes with process_vm_writev on all cores.
package memfill

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync/atomic"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/pagemap"
	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/diskroom"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/meter"
	"github.com/gpucr/gpucr/internal/parallel"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/sparse"
)

// MinRun is the smallest run of pages worth moving out of CRIU: smaller runs stay with it.
const MinRun = 16 << 20

// piece is how much one worker writes at a time: the image's hashing piece, so that a
// Source that verifies what it reads (a store) reads whole pieces.
const piece = image.HashChunkSize

// vmaAnonPrivate is CRIU's VMA status bit of private anonymous memory (criu/include/image.h).
const vmaAnonPrivate = 1 << 9

// Plan is a restore's division of memory between CRIU and memfill.
type Plan struct {
	// Dir is the image directory CRIU restores from: links to the image's files, with
	// rewritten pagemaps and page files for the processes whose runs memfill takes.
	Dir  string
	runs []run
	// skipped counts the zeros Fill left out (memory never touched reads as zeros): tests
	// read it.
	skipped atomic.Int64
}

// run is memory to write into pid at addr from file of src at off.
type run struct {
	pid  int
	addr uint64
	size int64
	src  Source
	file string // slash-separated, relative to src
	off  int64
}

// Renumber gives each run the process host[pid]: the restored processes, by their PIDs in
// the image (which a container's own PID namespace numbers otherwise than the host). A run
// of a process not among them is refused.
func (p *Plan) Renumber(host map[int]int) error {
	for i, r := range p.runs {
		h, ok := host[r.pid]
		if !ok {
			return fmt.Errorf("memory fill: process %d of the image is not among the restored processes", r.pid)
		}
		p.runs[i].pid = h
	}
	return nil
}

// Bytes is how much memory Fill writes.
func (p *Plan) Bytes() int64 {
	var n int64
	for _, r := range p.runs {
		n += r.size
	}
	return n
}

// Prepare plans the memory gpucr restores itself from the image m describes: the ranges it
// saved at checkpoint (criuimg.MemDir, as m lists them), read from mem, and, from the
// processes in split, the large runs it takes out of the view of the CRIU image in
// imageDir that CRIU then restores from (Plan.Dir, under work; "" when CRIU can use the
// image as it is). Only processes without children may be split: CRIU must restore itself
// the memory a child shares copy-on-write.
func Prepare(imageDir string, mem Source, work string, m *image.Manifest, split []int) (*Plan, error) {
	saved, err := savedRuns(m, mem)
	if err != nil {
		return nil, err
	}
	if len(split) == 0 {
		return &Plan{runs: saved}, nil
	}
	dir := filepath.Join(work, "images")
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("memory fill: %w", err)
	}
	p, err := prepare(image.CRIUPath(imageDir), dir, split)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if len(p.runs) == 0 {
		os.RemoveAll(dir)
		p.Dir = ""
	}
	p.runs = append(p.runs, saved...)
	return p, nil
}

func prepare(criuDir, dir string, pids []int) (*Plan, error) {
	p := &Plan{Dir: dir}
	rewritten := map[string]bool{}
	for _, pid := range pids {
		runs, files, err := p.split(criuDir, dir, pid)
		if err != nil {
			return nil, fmt.Errorf("memory fill: process %d: %w", pid, err)
		}
		p.runs = append(p.runs, runs...)
		for _, f := range files {
			rewritten[f] = true
		}
	}
	entries, err := os.ReadDir(criuDir)
	if err != nil {
		return nil, fmt.Errorf("memory fill: %w", err)
	}
	for _, e := range entries {
		if rewritten[e.Name()] {
			continue
		}
		if err := os.Symlink(filepath.Join(criuDir, e.Name()), filepath.Join(dir, e.Name())); err != nil {
			return nil, fmt.Errorf("memory fill: %w", err)
		}
	}
	return p, nil
}

// split takes pid's large runs out of its pagemap and page file, writing the rest into
// dir, and returns the runs and the names of the files it rewrote (none if it took nothing).
func (p *Plan) split(criuDir, dir string, pid int) ([]run, []string, error) {
	pmName := criuimg.PagemapName(pid)
	pm, err := criuimg.ReadPagemap(filepath.Join(criuDir, pmName))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil // a zombie or a process without private memory
	}
	if err != nil {
		return nil, nil, err
	}
	writable, err := WritableAnon(filepath.Join(criuDir, fmt.Sprintf("mm-%d.img", pid)))
	if err != nil {
		return nil, nil, err
	}
	pagesName := pm.PagesName()
	pagesPath := filepath.Join(criuDir, pagesName)

	// CRIU writes a long run of memory as many entries of a few hundred pages each:
	// consecutive present entries with contiguous addresses are one run here.
	var runs []run
	var kept []*pagemap.PagemapEntry
	type span struct{ off, size int64 }
	var keptData []span
	var group []*pagemap.PagemapEntry
	var groupOff, off int64
	flush := func() {
		if len(group) == 0 {
			return
		}
		start := group[0].GetVaddr()
		size := off - groupOff
		if size >= MinRun && writable(start, uint64(size)) {
			runs = append(runs, run{pid: pid, addr: start, size: size, src: Dir(criuDir), file: pagesName, off: groupOff})
		} else {
			kept = append(kept, group...)
			keptData = append(keptData, span{groupOff, size})
		}
		group = nil
	}
	for _, e := range pm.Entries {
		size := int64(e.GetNrPages()) * criuimg.PageSize
		if !criuimg.Present(e) {
			flush()
			kept = append(kept, e)
			continue
		}
		if len(group) > 0 && group[0].GetVaddr()+uint64(off-groupOff) != e.GetVaddr() {
			flush()
		}
		if len(group) == 0 {
			groupOff = off
		}
		group = append(group, e)
		off += size
	}
	flush()
	if len(runs) == 0 {
		return nil, nil, nil
	}
	if err := criuimg.WritePagemap(filepath.Join(dir, pmName), &criuimg.Pagemap{Head: pm.Head, Entries: kept}); err != nil {
		return nil, nil, err
	}
	src, err := os.Open(pagesPath)
	if err != nil {
		return nil, nil, err
	}
	defer src.Close()
	// The pages CRIU keeps are copied with their holes left holes, and only where they fit:
	// a crafted image's pages file of 2 GiB of holes in 42 MB had the restore write 2 GiB
	// of zeros into TMPDIR (hostile test).
	var data int64
	for _, s := range keptData {
		data += sparse.Data(src, s.off, s.size)
	}
	if err := diskroom.Check(dir, data); err != nil {
		return nil, nil, fmt.Errorf("copy %s: %w", pagesName, err)
	}
	dst, err := os.OpenFile(filepath.Join(dir, pagesName), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, nil, err
	}
	defer dst.Close()
	var at int64
	for _, s := range keptData {
		if err := sparse.Copy(src, dst, s.off, at, s.size); err != nil {
			return nil, nil, fmt.Errorf("copy %s: %w", pagesName, err)
		}
		at += s.size
	}
	if err := dst.Truncate(at); err != nil {
		return nil, nil, fmt.Errorf("copy %s: %w", pagesName, err)
	}
	return runs, []string{pmName, pagesName}, nil
}

// WritableAnon returns whether [addr, addr+size) lies in one writable private anonymous
// mapping of the process whose mm image is at path: process_vm_writev writes only there,
// and only there can CRIU's restore take memory gpucr saved.
func WritableAnon(path string) (func(addr, size uint64) bool, error) {
	e, err := criuimg.ReadMm(path)
	if err != nil {
		return nil, err
	}
	vmas := e.GetVmas()
	return func(addr, size uint64) bool {
		if addr+size < addr {
			return false // past the end of the address space
		}
		for _, v := range vmas {
			if addr >= v.GetStart() && addr+size <= v.GetEnd() {
				return v.GetStatus()&vmaAnonPrivate != 0 && v.GetProt()&unix.PROT_WRITE != 0
			}
		}
		return false
	}, nil
}

// Fill writes every run into its process, in pieces, on all cores (and more workers than
// cores, so that a store's latency is overlapped), then asks each source whether what it
// read is the image's. The processes must be restored and not yet resumed.
func (p *Plan) Fill(ctx context.Context) error {
	type job struct {
		r      run
		at     int64 // offset within the run
		len    int64
		sparse bool // the run is private anonymous memory: zeros need no write where untouched
	}
	anon, err := checkMapped(p.runs)
	if err != nil {
		return err
	}
	var jobs []job
	var sources []Source
	for i, r := range p.runs {
		if !slices.Contains(sources, r.src) {
			sources = append(sources, r.src)
		}
		for at := int64(0); at < r.size; at += piece {
			jobs = append(jobs, job{r, at, min(piece, r.size-at), anon[i]})
		}
	}
	// Each process is held by a pidfd from here on, and every piece is written only while
	// that process lives: a restored task that dies during the fill frees its PID, and a
	// hostile test had the image's memory written, as root, into the process that took it.
	live, err := holdProcesses(p.runs)
	if err != nil {
		return err
	}
	defer live.close()
	count := meter.From(ctx)
	count.SetTotal(p.Bytes())
	var pm pagemaps
	defer pm.close()
	err = parallel.Each(ctx, jobs, max(runtime.GOMAXPROCS(0), fillWorkers), func() []byte { return make([]byte, piece) },
		func(ctx context.Context, j job, buf []byte) error {
			return j.r.src.ReadPiece(ctx, j.r.file, j.r.off+j.at, buf[:j.len], func(at int, part []byte) error {
				addr := j.r.addr + uint64(j.at) + uint64(at)
				if err := live.check(j.r.pid); err != nil {
					return err
				}
				var skipped int64
				var err error
				if j.sparse {
					skipped, err = writeSparse(&pm, j.r.pid, addr, part)
				} else {
					err = moveRemote(unix.ProcessVMWritev, "memory fill: write", j.r.pid, addr, part)
				}
				if err != nil {
					return err
				}
				p.skipped.Add(skipped)
				count.Add(int64(len(part)))
				return nil
			})
		})
	if err != nil {
		return err
	}
	for _, src := range sources {
		if err := src.Verify(); err != nil {
			return err
		}
	}
	return nil
}

// pidfds holds the processes a fill writes into, by PID.
type pidfds map[int]int

// holdProcesses opens a pidfd of every process runs write into.
func holdProcesses(runs []run) (pidfds, error) {
	fds := pidfds{}
	for _, r := range runs {
		if _, ok := fds[r.pid]; ok {
			continue
		}
		fd, err := unix.PidfdOpen(r.pid, 0)
		if err != nil {
			fds.close()
			return nil, fmt.Errorf("memory fill: process %d: %w", r.pid, err)
		}
		fds[r.pid] = fd
	}
	return fds, nil
}

// check fails once pid's process, as held since the fill began, has exited: its PID may be
// another process's now.
func (fds pidfds) check(pid int) error {
	if err := unix.PidfdSendSignal(fds[pid], 0, nil, 0); err != nil {
		return fmt.Errorf("memory fill: restored process %d exited during the fill: %w", pid, err)
	}
	return nil
}

func (fds pidfds) close() {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// fillWorkers is the fewest pieces in flight at once: a store answers each after a round trip.
const fillWorkers = 8

// checkMapped refuses runs that are not wholly inside writable memory of their process's
// own as CRIU restored it: an image names addresses, and gpucr writes nowhere else — not
// through a shared mapping into a file (a range remapped so during a checkpoint had the
// restore write the image's bytes into that file, review). It returns which runs lie
// wholly in private anonymous memory.
func checkMapped(runs []run) ([]bool, error) {
	maps := map[int][]proctree.Mapping{}
	anon := make([]bool, len(runs))
	for i, r := range runs {
		ms, ok := maps[r.pid]
		if !ok {
			var err error
			if ms, err = writableMappings(r.pid); err != nil {
				return nil, fmt.Errorf("memory fill: %w", err)
			}
			maps[r.pid] = ms
		}
		end := r.addr + uint64(r.size)
		if !covered(ms, r.addr, end) {
			return nil, fmt.Errorf("memory fill: process %d has no writable private memory at %#x-%#x, which the image fills", r.pid, r.addr, end)
		}
		anon[i] = covered(slices.DeleteFunc(slices.Clone(ms), func(m proctree.Mapping) bool { return !m.PrivateAnonymous() }), r.addr, end)
	}
	return anon, nil
}

// writableMappings lists pid's private mappings it may write, by address.
func writableMappings(pid int) ([]proctree.Mapping, error) {
	all, err := proctree.ReadMaps(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil, fmt.Errorf("read mappings of process %d: %w", pid, err)
	}
	return slices.DeleteFunc(all, func(m proctree.Mapping) bool { return !m.Writable() || !m.Private() }), nil
}

// covered says whether [start, end) lies in ms, contiguous mappings joined (ms is sorted,
// as /proc lists them).
func covered(ms []proctree.Mapping, start, end uint64) bool {
	at := start
	for _, m := range ms {
		if m.Start <= at && at < m.End {
			at = m.End
			if at >= end {
				return true
			}
		}
	}
	return start == end
}

// vmOp is process_vm_readv or process_vm_writev.
type vmOp func(pid int, local []unix.Iovec, remote []unix.RemoteIovec, flags uint) (int, error)

// moveRemote moves all of data from or to pid's memory at addr with op; what names the
// move in errors.
func moveRemote(op vmOp, what string, pid int, addr uint64, data []byte) error {
	for len(data) > 0 {
		local := []unix.Iovec{{Base: &data[0]}}
		local[0].SetLen(len(data))
		remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: len(data)}}
		n, err := op(pid, local, remote, 0)
		if err != nil {
			return fmt.Errorf("%s %d bytes of process %d at %#x: %w", what, len(data), pid, addr, err)
		}
		if n == 0 {
			return fmt.Errorf("%s process %d at %#x: no bytes moved", what, pid, addr)
		}
		data, addr = data[n:], addr+uint64(n)
	}
	return nil
}

// maxPagesFile bounds the pages a pagemap may list: beyond it no file exists, and a sum
// that went on could wrap around to match a short pages file.
const maxPagesFile = 1 << 62

// CheckPages checks, before CRIU reads them, that each pages file in criuDir holds exactly
// the pages its pagemap says are there: CRIU's restorer spins forever on a pages file
// shorter than its pagemap, and an image whose manifest was rewritten to match a truncated
// file passes every checksum.
func CheckPages(criuDir string) error {
	maps, err := filepath.Glob(filepath.Join(criuDir, criuimg.PagemapGlob))
	if err != nil {
		return err
	}
	for _, path := range maps {
		pm, err := criuimg.ReadPagemap(path)
		if err != nil {
			return err
		}
		var want uint64
		for _, e := range pm.Entries {
			if criuimg.Present(e) {
				want += uint64(e.GetNrPages()) * criuimg.PageSize // at most 2^44 a time: checked before it can wrap
				if want > maxPagesFile {
					return &image.CorruptError{Path: image.CRIUDir + "/" + filepath.Base(path),
						Reason: "lists more pages than any file holds: damaged, or crafted to pass this check"}
				}
			}
		}
		pages := filepath.Join(criuDir, pm.PagesName())
		fi, err := os.Lstat(pages)
		switch {
		case errors.Is(err, fs.ErrNotExist) && want == 0:
			continue
		case err != nil:
			return fmt.Errorf("%s: its pages file: %w", filepath.Base(path), err)
		case uint64(fi.Size()) != want:
			return &image.CorruptError{Path: image.CRIUDir + "/" + filepath.Base(pages),
				Reason: fmt.Sprintf("%d bytes where %s lists %d: damaged, or changed with its manifest", fi.Size(), filepath.Base(path), want)}
		}
	}
	return nil
}
