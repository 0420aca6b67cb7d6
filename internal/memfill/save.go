package memfill

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/meter"
	"github.com/gpucr/gpucr/internal/parallel"
	"github.com/gpucr/gpucr/internal/proctree"
)

// Range is a run of a process's memory that gpucr saves itself at checkpoint: CRIU, told
// by SkipEnv, leaves it out of its dump, and Fill writes it back at restore.
type Range struct {
	PID        int // the process, as this host numbers it
	Start, End uint64
	// ImagePID is the process as the image numbers it, where that differs from PID (a
	// container's own PID namespace); 0 means PID.
	ImagePID int
}

func (r Range) imagePID() int {
	if r.ImagePID != 0 {
		return r.ImagePID
	}
	return r.PID
}

// file is where in the image (slash-separated) the range's bytes are saved.
func (r Range) file() string { return criuimg.MemDir + "/" + criuimg.MemName(r.imagePID(), r.Start) }

// SkipEnv names the file of ranges that gpucr's CRIU leaves out of a dump
// (scripts/criu-patches/0002-mem-skip-ranges-gpucr-saves.patch).
const SkipEnv = "GPUCR_SKIP_RANGES"

// Select returns, for every process of tree, the writable private anonymous mappings of at
// least MinRun bytes that are mostly in memory: a GPU process's staged device memory, large
// heaps. A process gives up a mapping that one of its descendants maps too, at any address
// in it: the two may share its pages copy-on-write, which CRIU must restore itself. (A GPU
// process's staging memory is mapped at checkpoint, long after its children were forked.)
func Select(tree []proctree.Process) ([]Range, error) {
	children := map[int][]int{}
	for _, p := range tree {
		children[p.PPID] = append(children[p.PPID], p.PID)
	}
	var out []Range
	for _, p := range tree {
		rs, err := selectOne(p.PID)
		if errors.Is(err, fs.ErrNotExist) {
			// Exited since the tree was read (a short-lived child): it is not CRIU's to dump
			// either. A checkpoint of a shell loop's tree failed every other time (hostile test).
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("memory save: process %d: %w", p.PID, err)
		}
		if len(children[p.PID]) > 0 && len(rs) > 0 {
			taken, err := descendantSpans(children, p.PID)
			if err != nil {
				return nil, fmt.Errorf("memory save: %w", err)
			}
			rs = slices.DeleteFunc(rs, func(r Range) bool {
				return slices.ContainsFunc(taken, func(s [2]uint64) bool { return s[0] < r.End && r.Start < s[1] })
			})
		}
		out = append(out, rs...)
	}
	return out, nil
}

// descendantSpans lists every mapping of pid's descendants (children lists them by parent).
func descendantSpans(children map[int][]int, pid int) ([][2]uint64, error) {
	var out [][2]uint64
	for _, c := range children[pid] {
		ms, err := proctree.ReadMaps(fmt.Sprintf("/proc/%d/maps", c))
		if errors.Is(err, fs.ErrNotExist) {
			continue // gone: it maps nothing
		}
		if err != nil {
			return nil, err
		}
		for _, m := range ms {
			out = append(out, [2]uint64{m.Start, m.End})
		}
		more, err := descendantSpans(children, c)
		if err != nil {
			return nil, err
		}
		out = append(out, more...)
	}
	return out, nil
}

func selectOne(pid int) ([]Range, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Range
	var cur *Range // the candidate mapping whose fields are being read
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if m, ok := proctree.ParseMapping(s.Text()); ok {
			cur = nil
			if m.Perms == "rw-p" && m.PrivateAnonymous() && m.End-m.Start >= MinRun {
				cur = &Range{PID: pid, Start: m.Start, End: m.End}
			}
			continue
		}
		switch {
		case cur != nil && len(fields) >= 2 && fields[0] == "Rss:":
			kb, _ := strconv.ParseUint(fields[1], 10, 64)
			if kb*1024 < (cur.End-cur.Start)/2 {
				cur = nil
			}
		case cur != nil && fields[0] == "VmFlags:":
			// Memory mapped from a device (io, pfnmap) is not ordinary memory to copy.
			if !slices.ContainsFunc(fields[1:], func(f string) bool { return f == "io" || f == "pf" }) {
				out = append(out, *cur)
			}
			cur = nil
		}
	}
	return out, s.Err()
}

// WriteRanges writes rs in the form gpucr's CRIU reads from SkipEnv's file.
func WriteRanges(path string, rs []Range) error {
	var b strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&b, "%d %x %x\n", r.imagePID(), r.Start, r.End)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("memory save: %w", err)
	}
	return nil
}

// Save reads every range from its process, on all cores, into imageDir's criuimg.MemDir,
// and returns the files' manifest entries, checksummed as they were written. The processes
// must be frozen. All-zero pieces are left as holes. Nothing is synced: Sync does that.
// Files are made from what res (nil for none) has allocated ahead.
func Save(ctx context.Context, imageDir string, rs []Range, res *Reserve) ([]image.File, error) {
	if err := stillWritable(rs); err != nil {
		return nil, err
	}
	workers := runtime.GOMAXPROCS(0)
	rs = segments(rs, segmentSizeFor(rs, workers))
	count := counting(ctx, rs)
	dir := filepath.Join(imageDir, criuimg.MemDir)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("memory save: %w", err)
	}
	type job struct {
		file  int
		index int
		r     Range
	}
	// Files are created whole first and opened again for each piece, so that a tree with
	// thousands of ranges does not hold thousands of descriptors.
	paths := make([]string, len(rs))
	pieces := make([][]image.Piece, len(rs))
	reserved := res.take()
	fromReserve := make([]bool, len(rs))
	for i, r := range rs {
		paths[i] = filepath.Join(imageDir, filepath.FromSlash(r.file()))
		size := int64(r.End - r.Start)
		var err error
		if fromReserve[i], err = place(&reserved, paths[i], size); err != nil {
			return nil, fmt.Errorf("memory save: %w", err)
		}
		pieces[i] = make([]image.Piece, (size+image.HashChunkSize-1)/image.HashChunkSize)
	}
	perFile := make([][]job, len(rs))
	for i, r := range rs {
		for k := range pieces[i] {
			perFile[i] = append(perFile[i], job{i, k, r})
		}
	}
	jobs := parallel.Interleave(perFile)
	zero := make([]byte, step)
	err := parallel.Each(ctx, jobs, workers, func() []byte { return make([]byte, step) },
		func(_ context.Context, j job, buf []byte) error {
			start := int64(j.index) * image.HashChunkSize
			end := min(start+image.HashChunkSize, int64(j.r.End-j.r.Start))
			h := image.NewPieceHash(false) // a signed image's SHA-256s are taken as it is sealed
			for off := start; off < end; off += step {
				data := buf[:min(step, end-off)]
				if err := moveRemote(unix.ProcessVMReadv, "memory save: read", j.r.PID, j.r.Start+uint64(off), data); err != nil {
					return err
				}
				h.Add(data)
				var err error
				switch {
				case !bytes.Equal(data, zero[:len(data)]):
					err = writeAt(paths[j.file], data, off)
				case fromReserve[j.file]:
					err = punchAt(paths[j.file], off, int64(len(data))) // a hole, as in a file made empty
				}
				if err != nil {
					return fmt.Errorf("memory save: %w", err)
				}
				count.Add(int64(len(data)))
			}
			pieces[j.file][j.index] = h.Sum()
			return nil
		})
	if err != nil {
		return nil, err
	}
	if err := res.Release(); err != nil {
		return nil, err
	}
	out := make([]image.File, len(rs))
	for i, r := range rs {
		out[i] = image.FileOf(r.file(), int64(r.End-r.Start), pieces[i], false)
	}
	return out, nil
}

// Sync makes the files Save wrote under imageDir durable. It is apart from Save so that a
// tree left running can run again once Save has copied its memory.
func Sync(ctx context.Context, imageDir string, files []image.File) error {
	err := parallel.Each(ctx, files, runtime.GOMAXPROCS(0), func() struct{} { return struct{}{} }, func(_ context.Context, f image.File, _ struct{}) error {
		return syncFile(filepath.Join(imageDir, filepath.FromSlash(f.Path)))
	})
	if err != nil {
		return fmt.Errorf("memory save: make durable: %w", err)
	}
	return nil
}

// SaveTo is Save for a checkpoint streamed to a store: every range is read from its process,
// on all cores, into the criuimg.MemDir file that create starts for it (path relative to
// the image), a file per worker at a time, straight into the receiver's own buffers. The
// processes must be frozen.
func SaveTo(ctx context.Context, rs []Range, create func(path string) (criuimg.Receiver, error)) error {
	if err := stillWritable(rs); err != nil {
		return err
	}
	workers := runtime.GOMAXPROCS(0)
	rs = segments(rs, segmentSizeFor(rs, workers))
	count := counting(ctx, rs)
	return parallel.Each(ctx, rs, workers, func() struct{} { return struct{}{} },
		func(_ context.Context, r Range, _ struct{}) error {
			f, err := create(r.file())
			if err != nil {
				return fmt.Errorf("memory save: %w", err)
			}
			size := r.End - r.Start
			for at := uint64(0); at < size; at += image.HashChunkSize {
				n := min(image.HashChunkSize, size-at)
				if err := f.Receive(at, int(n), &remoteReader{pid: r.PID, addr: r.Start + at}); err != nil {
					return fmt.Errorf("memory save: %w", err)
				}
				count.Add(int64(n))
			}
			if err := f.Close(); err != nil {
				return fmt.Errorf("memory save: %w", err)
			}
			return nil
		})
}

// stillWritable checks, once the tree is frozen, that every range still lies in writable
// private memory of its process, as the restore's fill demands of the same mappings
// (checkMapped). The ranges are chosen before the freeze: a thread that made part of one
// read-only in between had it saved and left out of CRIU's dump, and the image could never
// be restored; one that mapped a file shared over it had the file's bytes saved as memory
// (review). Such a checkpoint fails instead, and the workload runs on.
func stillWritable(rs []Range) error {
	maps := map[int][]proctree.Mapping{}
	for _, r := range rs {
		ms, ok := maps[r.PID]
		if !ok {
			var err error
			if ms, err = writableMappings(r.PID); err != nil {
				return fmt.Errorf("memory save: %w", err)
			}
			maps[r.PID] = ms
		}
		if !covered(ms, r.Start, r.End) {
			return fmt.Errorf("memory save: process %d's memory at %#x-%#x is no longer all writable private memory: it changed as the checkpoint began; checkpoint again", r.PID, r.Start, r.End)
		}
	}
	return nil
}

// remoteReader reads the memory of process pid from addr on.
type remoteReader struct {
	pid  int
	addr uint64
}

func (r *remoteReader) Read(p []byte) (int, error) {
	if err := moveRemote(unix.ProcessVMReadv, "read", r.pid, r.addr, p); err != nil {
		return 0, err
	}
	r.addr += uint64(len(p))
	return len(p), nil
}

// counting is the meter.Counter ctx carries, told the bytes of rs as its total.
func counting(ctx context.Context, rs []Range) *meter.Counter {
	c := meter.From(ctx)
	var total uint64
	for _, r := range rs {
		total += r.End - r.Start
	}
	c.SetTotal(int64(total))
	return c
}

func createSized(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func punchAt(path string, off, n int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	err = unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
	return errors.Join(err, f.Close())
}

func writeAt(path string, data []byte, off int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(data, off); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func syncFile(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// step is how much of a piece the save and the fill move at a time: small enough that the
// bytes read (from the process, or from the image) are still in the core's cache when they
// are hashed, checked and written, instead of a whole piece per worker going through main
// memory twice more.
const step = 1 << 20

// maxSegment is the most one file of criuimg.MemDir holds. Writes to one tmpfs file
// serialize on its inode lock, so the save spreads its workers over many files: one file
// written by 16 workers at once ran at ~4 GB/s on the H100 machine, where reads into memory
// ran at 16 GB/s.
const maxSegment = 256 << 20

// segmentSizeFor cuts rs into at least two files per worker where pieces allow, and files of
// at most maxSegment.
func segmentSizeFor(rs []Range, workers int) uint64 {
	var total uint64
	for _, r := range rs {
		total += r.End - r.Start
	}
	size := total / uint64(2*workers) / image.HashChunkSize * image.HashChunkSize
	return min(max(size, image.HashChunkSize), maxSegment)
}

// segments cuts rs into pieces of at most size bytes, each saved as one file.
func segments(rs []Range, size uint64) []Range {
	var out []Range
	for _, r := range rs {
		for s := r.Start; s < r.End; s += size {
			seg := r
			seg.Start, seg.End = s, min(s+size, r.End)
			out = append(out, seg)
		}
	}
	return out
}

// SavedBytes is, per process, how much memory gpucr saved itself in the image m describes.
func SavedBytes(imageDir string, m *image.Manifest) (map[int]int64, error) {
	runs, err := savedRuns(m, Dir(imageDir))
	if err != nil {
		return nil, err
	}
	out := map[int]int64{}
	for _, r := range runs {
		out[r.pid] += r.size
	}
	return out, nil
}

// savedRuns are the ranges gpucr saved in the image m describes, as runs for Fill from src:
// only the files its manifest lists under criuimg.MemDir, each into a process of the
// image's tree.
func savedRuns(m *image.Manifest, src Source) ([]run, error) {
	procs := map[int]bool{}
	for _, p := range m.Processes {
		procs[p.PID] = true
	}
	var out []run
	for _, f := range m.Files {
		if path.Dir(f.Path) != criuimg.MemDir {
			continue
		}
		pid, start, ok := criuimg.ParseMemName(path.Base(f.Path))
		switch {
		case !ok:
			return nil, &image.CorruptError{Path: f.Path, Reason: "not a memory range gpucr saved"}
		case !procs[pid]:
			return nil, &image.CorruptError{Path: f.Path, Reason: fmt.Sprintf("names process %d, which is not in the image's tree", pid)}
		case start+uint64(f.Size) < start:
			return nil, &image.CorruptError{Path: f.Path, Reason: "range past the end of the address space"}
		case start%criuimg.PageSize != 0 || f.Size%criuimg.PageSize != 0:
			return nil, &image.CorruptError{Path: f.Path, Reason: "not a run of whole pages"}
		}
		out = append(out, run{pid: pid, addr: start, size: f.Size, src: src, file: f.Path})
	}
	return out, overlap(out)
}

// overlap refuses runs of which two write the same memory of a process: gpucr saves each
// page once, and the fill writes runs at once, so which one's bytes stayed was chance. A
// crafted image's run moved a byte, or a page, over another was restored so and said
// restored, where fold refused it (hostile test).
func overlap(runs []run) error {
	sorted := slices.Clone(runs)
	slices.SortFunc(sorted, func(a, b run) int { return cmp.Or(cmp.Compare(a.pid, b.pid), cmp.Compare(a.addr, b.addr)) })
	for i := 1; i < len(sorted); i++ {
		if prev, r := sorted[i-1], sorted[i]; prev.pid == r.pid && prev.addr+uint64(prev.size) > r.addr {
			return &image.CorruptError{Path: r.file, Reason: fmt.Sprintf("overlaps %s: both fill process %d at %#x", prev.file, r.pid, r.addr)}
		}
	}
	return nil
}
