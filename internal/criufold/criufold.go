// Package criufold writes a copy of a gpucr image whose memory is all in CRIU's own page
// files, so that plain `criu restore` restores every process's memory: the runs gpucr saved
// itself in mem/ go back into their processes' pagemaps and page files.
package criufold

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/pagemap"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/internal/beneath"
	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/diskroom"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/memfill"
	"github.com/gpucr/gpucr/internal/sparse"
)

// entryPages is the most pages one pagemap entry of a folded run lists, as CRIU cuts
// long runs into entries of its own.
const entryPages = 1024

// Result is what a fold moved.
type Result struct {
	Manifest *image.Manifest
	Runs     int   // the files of mem/ folded
	Bytes    int64 // their bytes
}

// Fold writes the image at src, which m describes and the caller verified, as a new image
// at dst (absent or empty) whose mem/ is folded into CRIU's files. The new image is a gpucr
// image like any other (committed atomically, checksummed; unsigned, as its files differ
// from those src's signatures cover), and its criu/ is restorable by CRIU alone.
// It is staged at staging (image.StagingPath of dst, journaled by the caller so that a fold
// killed halfway leaves its copy to recovery), or at a fresh name when staging is "".
func Fold(ctx context.Context, src string, m *image.Manifest, dst, staging string) (_ *Result, err error) {
	runs, err := memRuns(src, m)
	if err != nil {
		return nil, err
	}
	stage, err := image.BeginAt(dst, staging)
	if err != nil {
		return nil, err
	}
	// Removes a fold that failed (after Commit it does nothing); a leftover is reported too.
	defer func() { err = errors.Join(err, stage.Abort()) }()
	// Refused before a byte is written where the new image would not fit: a fold filled
	// the disk it wrote to (hostile test).
	if err := diskroom.Check(stage.Dir(), footprint(src, m)); err != nil {
		return nil, fmt.Errorf("fold %s: %w", src, err)
	}
	res := &Result{}
	rewritten := map[string]bool{}
	for _, pid := range slices.Sorted(maps.Keys(runs)) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		files, err := foldProcess(src, stage.Dir(), pid, runs[pid])
		if err != nil {
			return nil, fmt.Errorf("fold process %d: %w", pid, err)
		}
		for _, f := range files {
			rewritten[f] = true
		}
		for _, r := range runs[pid] {
			res.Runs++
			res.Bytes += r.size
		}
	}
	for _, f := range m.Files {
		if path.Dir(f.Path) == criuimg.MemDir || rewritten[f.Path] {
			continue
		}
		if err := copyFile(ctx, src, filepath.FromSlash(f.Path), filepath.Join(stage.Dir(), f.Path)); err != nil {
			return nil, err
		}
	}
	if err := copyLogs(ctx, src, stage.Dir()); err != nil {
		return nil, err
	}
	folded := *m
	folded.Files = nil
	if err := stage.Commit(&folded); err != nil {
		return nil, err
	}
	res.Manifest = &folded
	return res, nil
}

// run is a file of mem/: size bytes of process memory at addr.
type run struct {
	addr uint64
	size int64
	file string
}

// memRuns reads the runs of mem/ from m, by process.
func memRuns(src string, m *image.Manifest) (map[int][]run, error) {
	procs := map[int]bool{}
	for _, p := range m.Processes {
		procs[p.PID] = true
	}
	out := map[int][]run{}
	for _, f := range m.Files {
		if path.Dir(f.Path) != criuimg.MemDir {
			continue
		}
		pid, addr, ok := criuimg.ParseMemName(path.Base(f.Path))
		switch {
		case !ok:
			return nil, &image.CorruptError{Path: f.Path, Reason: "not a memory range gpucr saved"}
		case !procs[pid]:
			return nil, &image.CorruptError{Path: f.Path, Reason: fmt.Sprintf("names process %d, which is not in the image's tree", pid)}
		case f.Size%criuimg.PageSize != 0 || addr%criuimg.PageSize != 0 || addr+uint64(f.Size) < addr:
			return nil, &image.CorruptError{Path: f.Path, Reason: "not a run of whole pages"}
		}
		out[pid] = append(out[pid], run{addr: addr, size: f.Size, file: filepath.Join(src, filepath.FromSlash(f.Path))})
	}
	return out, nil
}

// piece is one present entry of the folded pagemap and where its pages come from.
type piece struct {
	e    *pagemap.PagemapEntry
	file string
	off  int64
}

// foldProcess writes pid's pagemap and pages file into the staged image with runs added,
// in address order, and returns their image paths.
func foldProcess(src, stage string, pid int, runs []run) ([]string, error) {
	criuDir := image.CRIUPath(src)
	pmName := criuimg.PagemapName(pid)
	pm, err := criuimg.ReadPagemap(filepath.Join(criuDir, pmName))
	if err != nil {
		return nil, err
	}
	pagesName := pm.PagesName()
	if err := soleUser(criuDir, pmName, pm.Head.GetPagesId()); err != nil {
		return nil, err
	}
	writable, err := memfill.WritableAnon(filepath.Join(criuDir, fmt.Sprintf("mm-%d.img", pid)))
	if err != nil {
		return nil, err
	}
	var pieces []piece
	var off int64
	for _, e := range pm.Entries {
		p := piece{e: e}
		if criuimg.Present(e) {
			p.file, p.off = filepath.Join(criuDir, pagesName), off
			off += int64(e.GetNrPages()) * criuimg.PageSize
		}
		pieces = append(pieces, p)
	}
	for _, r := range runs {
		if !writable(r.addr, uint64(r.size)) {
			return nil, fmt.Errorf("%w: the run at %#x is not in one writable private anonymous mapping of the process", image.ErrCorrupt, r.addr)
		}
		for at := int64(0); at < r.size; at += entryPages * criuimg.PageSize {
			n := min(r.size-at, entryPages*criuimg.PageSize)
			e := &pagemap.PagemapEntry{Vaddr: proto.Uint64(r.addr + uint64(at)), NrPages: proto.Uint32(uint32(n / criuimg.PageSize)),
				Flags: proto.Uint32(criuimg.PEPresent)}
			pieces = append(pieces, piece{e: e, file: r.file, off: at})
		}
	}
	slices.SortStableFunc(pieces, func(a, b piece) int {
		switch va, vb := a.e.GetVaddr(), b.e.GetVaddr(); {
		case va < vb:
			return -1
		case va > vb:
			return 1
		}
		return 0
	})
	entries := make([]*pagemap.PagemapEntry, len(pieces))
	for i, p := range pieces {
		entries[i] = p.e
		if i > 0 {
			prev := pieces[i-1].e
			if prev.GetVaddr()+uint64(prev.GetNrPages())*criuimg.PageSize > p.e.GetVaddr() {
				return nil, fmt.Errorf("%w: memory at %#x is both in CRIU's pages and in mem/", image.ErrCorrupt, p.e.GetVaddr())
			}
		}
	}
	if err := criuimg.WritePagemap(filepath.Join(stage, image.CRIUDir, pmName), &criuimg.Pagemap{Head: pm.Head, Entries: entries}); err != nil {
		return nil, err
	}
	if err := writePages(src, filepath.Join(stage, image.CRIUDir, pagesName), pieces); err != nil {
		return nil, err
	}
	return []string{image.CRIUDir + "/" + pmName, image.CRIUDir + "/" + pagesName}, nil
}

// soleUser refuses to rewrite a pages file that another pagemap than pmName reads too.
func soleUser(criuDir, pmName string, id uint32) error {
	maps, err := filepath.Glob(filepath.Join(criuDir, criuimg.PagemapGlob))
	if err != nil {
		return err
	}
	for _, p := range maps {
		if filepath.Base(p) == pmName {
			continue
		}
		other, err := criuimg.ReadPagemap(p)
		if err != nil {
			return err
		}
		if other.Head.GetPagesId() == id {
			return fmt.Errorf("%w: %s and %s share %s", image.ErrCorrupt, pmName, filepath.Base(p), criuimg.PagesName(id))
		}
	}
	return nil
}

// chunk is how much writePages copies at a time; all-zero chunks are left as holes.
const chunk = 1 << 20

// writePages writes the present pieces' pages one after another, as CRIU reads them; their
// files lie in the image at src.
func writePages(src, dst string, pieces []piece) error {
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	buf, zero := make([]byte, chunk), make([]byte, chunk)
	files := map[string]*os.File{}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	var at int64
	for _, p := range pieces {
		if p.file == "" {
			continue
		}
		in := files[p.file]
		if in == nil {
			if in, err = openIn(src, p.file); err != nil {
				return err
			}
			files[p.file] = in
		}
		size := int64(p.e.GetNrPages()) * criuimg.PageSize
		for done := int64(0); done < size; {
			b := buf[:min(chunk, size-done)]
			if _, err := in.ReadAt(b, p.off+done); err != nil {
				return fmt.Errorf("read %s: %w", filepath.Base(p.file), err)
			}
			if err := writeData(out, b, at, zero); err != nil {
				return err
			}
			done += int64(len(b))
			at += int64(len(b))
		}
	}
	if err := out.Truncate(at); err != nil {
		return err
	}
	return out.Close()
}

// writeData writes b at at in out but for its zero pages, which stay holes: a run with one
// byte set in each MiB took a MiB of disk for each, 256 times the room the fold's check
// counted for it (review).
func writeData(out *os.File, b []byte, at int64, zero []byte) error {
	page := func(i int) []byte { return b[i:min(i+criuimg.PageSize, len(b))] }
	for i := 0; i < len(b); {
		j := i
		for j < len(b) && !bytes.Equal(page(j), zero[:len(page(j))]) {
			j += criuimg.PageSize
		}
		if j > i {
			if _, err := out.WriteAt(b[i:min(j, len(b))], at+int64(i)); err != nil {
				return err
			}
		}
		for j < len(b) && bytes.Equal(page(j), zero[:len(page(j))]) {
			j += criuimg.PageSize
		}
		i = j
	}
	return nil
}

// openIn opens the file at path in the image at dir as beneath.Open does: whoever can write
// the image may have swapped it, since it was verified, for a symlink to a file of root's or
// a FIFO.
func openIn(dir, path string) (*os.File, error) {
	rel, err := filepath.Rel(dir, path)
	if err != nil {
		return nil, err
	}
	return beneath.Open(dir, rel)
}

// copyFile copies the file rel of the image at dir to dst, creating its directory; rel is
// opened as beneath.Open does (see openIn).
func copyFile(ctx context.Context, dir, rel, dst string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	in, err := beneath.Open(dir, rel)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if err := copyData(in, out); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", filepath.Join(dir, rel), err)
	}
	return out.Close()
}

// copyData copies in's data into out and leaves its holes holes: copied byte for byte, a
// file of 4 GiB of holes in an image of 21 MiB took 4 GiB of the new image's disk (hostile
// test). Each run of data is copied in the kernel (copy_file_range) where it can be.
func copyData(in, out *os.File) error {
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // holes to the end
		}
		hole := size
		if err != nil {
			data = off // a file system that cannot tell: all of it is data
		} else if hole, err = unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE); err != nil {
			hole = size
		}
		hole = min(hole, size)
		if err := sparse.CopyRange(in, out, data, data, hole-data); err != nil {
			return err
		}
		if afterRange != nil {
			afterRange()
		}
		off = hole
	}
	// A file that shrank meanwhile reads as holes to its old end: its copy would be padded
	// with zeros and sealed as it was (review).
	if now, err := in.Stat(); err != nil || now.Size() != size {
		return fmt.Errorf("the file changed while it was copied (%d bytes, now %v)", size, sizeOf(now))
	}
	return out.Truncate(size)
}

// afterRange, when set, runs after each run of data is copied: tests change the file there.
var afterRange func()

// sizeOf is fi's size, or "gone" without fi.
func sizeOf(fi os.FileInfo) string {
	if fi == nil {
		return "gone"
	}
	return strconv.FormatInt(fi.Size(), 10)
}

// footprint is the disk the files of m, and CRIU's logs, take in dir: what a fold writes
// again, holes left holes, at most.
func footprint(dir string, m *image.Manifest) int64 {
	var n int64
	add := func(p string) {
		var st unix.Stat_t
		if unix.Lstat(p, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
			n += st.Blocks * 512
		}
	}
	for _, f := range m.Files {
		add(filepath.Join(dir, filepath.FromSlash(f.Path)))
	}
	logs, _ := os.ReadDir(filepath.Join(dir, image.LogsDir))
	for _, e := range logs {
		add(filepath.Join(dir, image.LogsDir, e.Name()))
	}
	return n
}

// copyLogs copies CRIU's logs, which no manifest lists, for whoever reads the new image.
func copyLogs(ctx context.Context, src, dst string) error {
	entries, err := os.ReadDir(filepath.Join(src, image.LogsDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if err := copyFile(ctx, src, filepath.Join(image.LogsDir, e.Name()), filepath.Join(dst, image.LogsDir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}
