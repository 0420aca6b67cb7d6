// Package criuimg owns CRIU's image formats as gpucr meets them: the memory files' names and
// constants, pagemaps (read and written only here), and what `gpucr inspect` reads.
//
// Images are decoded one file at a time, through an fs.FS (a directory, or the files of
// an archive held in memory), into go-criu's generated messages. crit's Explore* helpers
// are not used: they cache files.img in package globals (so a second directory would be
// resolved against the first one's files, and concurrent calls race) and ExplorePs panics
// on an orphaned entry; crit's Decode reads only an *os.File.
package criuimg

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	criu_core "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	fsimg "github.com/checkpoint-restore/go-criu/v7/crit/images/fs"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/mm"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pstree"
	remap_file_path "github.com/checkpoint-restore/go-criu/v7/crit/images/remap-file-path"
	"github.com/checkpoint-restore/go-criu/v7/magic"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/internal/beneath"
	"github.com/gpucr/gpucr/internal/protobound"
)

// Summary is an image's process tree with each process's memory and files.
type Summary struct {
	Processes   []Process `json:"processes"`
	MemoryBytes uint64    `json:"memoryBytes"` // bytes of dumped pages (pagemap entries * page size)
}

// Process is one process of the image.
type Process struct {
	PID         int        `json:"pid"`
	PPID        int        `json:"ppid"`
	Command     string     `json:"command"`
	Threads     int        `json:"threads"`
	MemoryBytes uint64     `json:"memoryBytes"` // this process's dumped pages
	Files       []OpenFile `json:"files"`
}

// OpenFile is one file descriptor of a process.
type OpenFile struct {
	FD   int    `json:"fd"`
	Type string `json:"type"` // CRIU's fd type in lower case ("reg", "pipe", "unixsk", ...) or "unknown"
	Path string `json:"path"` // file name, "pipe:[id]" or "socket:[inode]"; empty where CRIU records none
}

// Read summarizes the CRIU images in dir. Processes come in the order of
// pstree.img: the root first, every parent before its children.
func Read(dir string) (*Summary, error) { return ReadFS(beneath.FS(dir)) }

// ReadFS is Read of the CRIU images in fsys: those of an archive need not be on disk.
func ReadFS(fsys fs.FS) (*Summary, error) {
	n := newBudget()
	tree, err := decode(n, fsys, "pstree.img", &pstree.PstreeEntry{})
	if err != nil {
		return nil, err
	}
	if len(tree) == 0 {
		return nil, errors.New("read pstree.img: no processes")
	}
	entries, err := decode(n, fsys, "files.img", &fdinfo.FileEntry{})
	if err != nil {
		return nil, err
	}
	files := make(map[uint32]*fdinfo.FileEntry, len(entries))
	for _, f := range entries {
		files[f.GetId()] = f
	}

	s := &Summary{Processes: make([]Process, 0, len(tree))}
	r := &processReader{fsys: fsys, n: n, files: files, fds: map[uint32][]OpenFile{}}
	for _, t := range tree {
		p, err := r.read(t)
		if err != nil {
			return nil, err
		}
		s.Processes = append(s.Processes, p)
		s.MemoryBytes += p.MemoryBytes
	}
	return s, nil
}

// taskDead is CRIU's task state of a zombie (TASK_DEAD in its core image).
const taskDead = 2

// processReader reads the processes of one image, within one budget: the files table, and
// each descriptor table read once however many processes share it.
type processReader struct {
	fsys  fs.FS
	n     *budget
	files map[uint32]*fdinfo.FileEntry
	fds   map[uint32][]OpenFile // by files ID
}

// read reads the core, pagemap, ids and fdinfo images of one pstree entry.
func (r *processReader) read(t *pstree.PstreeEntry) (Process, error) {
	fsys, n := r.fsys, r.n
	pid := t.GetPid()
	p := Process{PID: int(pid), PPID: int(t.GetPpid()), Threads: len(t.GetThreads())}

	name := fmt.Sprintf("core-%d.img", pid)
	core, err := decode(n, fsys, name, &criu_core.CoreEntry{})
	if err != nil {
		return p, err
	}
	if len(core) == 0 {
		return p, fmt.Errorf("read %s: no entries", name)
	}
	p.Command = core[0].GetTc().GetComm()
	if core[0].GetTc().GetTaskState() == taskDead {
		return p, nil // a zombie: CRIU writes its core alone, no memory and no files
	}

	pm, err := readPagemap(n, fsys, PagemapName(int(pid)))
	if err != nil {
		return p, err
	}
	for _, e := range pm.Entries {
		p.MemoryBytes += uint64(e.GetNrPages()) * PageSize
	}

	name = fmt.Sprintf("ids-%d.img", pid)
	ids, err := decode(n, fsys, name, &criu_core.TaskKobjIdsEntry{})
	if err != nil {
		return p, err
	}
	if len(ids) == 0 {
		return p, fmt.Errorf("read %s: no entries", name)
	}
	id := ids[0].GetFilesId()
	if open, ok := r.fds[id]; ok {
		p.Files = open
		return p, nil
	}
	fds, err := decode(n, fsys, fmt.Sprintf("fdinfo-%d.img", id), &fdinfo.FdinfoEntry{})
	if err != nil {
		return p, err
	}
	p.Files = make([]OpenFile, 0, len(fds))
	for _, fd := range fds {
		p.Files = append(p.Files, openFile(fd, r.files[fd.GetId()]))
	}
	r.fds[id] = p.Files
	return p, nil
}

// openFile describes fd; f is its files.img entry, nil if there is none.
func openFile(fd *fdinfo.FdinfoEntry, f *fdinfo.FileEntry) OpenFile {
	o := OpenFile{FD: int(fd.GetFd()), Type: "unknown"}
	if t := fd.GetType(); t != fdinfo.FdTypes_UND {
		o.Type = strings.ToLower(t.String())
	}
	switch {
	case f.GetReg() != nil:
		o.Path = f.GetReg().GetName()
	case f.GetPipe() != nil:
		o.Path = fmt.Sprintf("pipe:[%d]", f.GetPipe().GetPipeId())
	case f.GetUsk() != nil && len(f.GetUsk().GetName()) > 0:
		o.Path = string(f.GetUsk().GetName())
	case f.GetUsk() != nil:
		o.Path = fmt.Sprintf("socket:[%d]", f.GetUsk().GetIno())
	case f.GetIsk() != nil:
		o.Path = fmt.Sprintf("socket:[%d]", f.GetIsk().GetIno())
	}
	return o
}

// magics are the image magics CRIU writes.
var magics = magic.LoadMagic()

// maxImage bounds the CRIU image files gpucr decodes: metadata, decoded whole into memory.
// Page files, which can be any size, are never decoded.
const maxImage = 256 << 20

// maxEntries bounds what gpucr decodes from one image, all its files together, in entries
// (each costs ~100 bytes of memory decoded, however few bytes it took in the file: a hostile
// image of tiny entries cost 5 GB), the messages nested in them, and an eighth of each
// value of their repeated fields (protobound). Four million is a pagemap of a process whose
// dumped memory is 16 GiB of pages none of which is next to another. (A variable: tests
// lower it.)
var maxEntries = 4 << 20

// budget bounds what one reading of an image decodes (maxEntries), all its files together: a crafted image can have many processes name one file
// of tiny entries (a hostile test's inspect took 2.8 GB so, each file within maxEntries).
type budget struct{ left int }

// newBudget is the budget of one reading of an image.
func newBudget() *budget { return &budget{left: maxEntries} }

// decode returns the entries of image name in fsys that are of entry's type, within n.
func decode[M proto.Message](n *budget, fsys fs.FS, name string, entry M) ([]M, error) {
	var out []M
	err := eachFrame(n, fsys, name, 0, func(b []byte) error {
		m := entry.ProtoReflect().New().Interface().(M)
		if err := n.unmarshal(name, b, m); err != nil {
			return err
		}
		out = append(out, m)
		return nil
	})
	return out, err
}

// unmarshal decodes the entry b of image name into m, charging n for the messages nested
// in it and the values of its repeated fields before they are made: an empty nested message
// is two bytes of the file and a struct of memory, so entries alone do not bound what an
// image costs.
func (n *budget) unmarshal(name string, b []byte, m proto.Message) error {
	k, err := protobound.Cost(b, m.ProtoReflect().Descriptor(), n.left)
	if errors.Is(err, protobound.ErrTooMany) {
		return n.exhausted(name)
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", name, err)
	}
	n.left -= k
	if err := proto.Unmarshal(b, m); err != nil {
		return fmt.Errorf("read %s: %w", name, err)
	}
	return nil
}

// exhausted is the error of a reading past its budget, met in image name.
func (n *budget) exhausted(name string) error {
	return fmt.Errorf("read %s: the image's files hold more than %d entries, nested messages and repeated values, more than gpucr reads", name, maxEntries)
}

// eachFrame reads image name in fsys and hands use each entry's bytes in turn, as CRIU
// frames them after the image's magic: each entry's size in 32 bits, then the entry. The
// bytes are use's only until it returns. Every frame is checked to fit in the file before
// it is read (a few bytes claiming 4 GiB would otherwise cost 4 GiB); an empty entry
// (which no entry gpucr reads encodes to) and entries past the budget n are refused. The
// magic must be one CRIU writes, as crit requires, and want when want is not 0.
func eachFrame(n *budget, fsys fs.FS, name string, want uint32, use func([]byte) error) error {
	f, err := fsys.Open(name)
	if err != nil {
		return fmt.Errorf("read %s: %w", name, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("read %s: %w", name, err)
	}
	size := fi.Size()
	if size > maxImage {
		return fmt.Errorf("read %s: larger than %d MiB, more than CRIU writes", name, maxImage>>20)
	}
	r := bufio.NewReaderSize(f, 64<<10)
	var off int64
	word := func() (uint32, error) {
		var b [4]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return 0, fmt.Errorf("read %s: at offset %d: %w", name, off, err)
		}
		off += 4
		return binary.LittleEndian.Uint32(b[:]), nil
	}
	m, err := word()
	if err != nil {
		return err
	}
	if m == imgCommonMagic || m == imgServiceMagic {
		if m, err = word(); err != nil {
			return err
		}
	}
	if _, known := magics.ByValue[uint64(m)]; !known || want != 0 && m != want {
		return fmt.Errorf("read %s: not the CRIU image expected (magic %#x)", name, m)
	}
	var buf []byte
	for off < size {
		size32, err := word()
		if err != nil {
			return err
		}
		k := int(size32)
		switch {
		case int64(k) > size-off:
			return fmt.Errorf("read %s: entry at offset %d claims %d bytes, %d follow: %w", name, off-4, k, size-off, io.ErrUnexpectedEOF)
		case k == 0:
			return fmt.Errorf("read %s: empty entry at offset %d, which CRIU does not write", name, off-4)
		case n.left == 0:
			return n.exhausted(name)
		}
		n.left--
		if cap(buf) < k {
			buf = make([]byte, k)
		}
		if _, err := io.ReadFull(r, buf[:k]); err != nil {
			return fmt.Errorf("read %s: at offset %d: %w", name, off, err)
		}
		off += int64(k)
		if err := use(buf[:k]); err != nil {
			return err
		}
	}
	return nil
}

// The magics that may come before an image's own, and the pagemap's own
// (criu/include/magic.h).
const (
	imgCommonMagic  = 0x54564319
	imgServiceMagic = 0x55105940
	pagemapMagic    = 0x56084025
	filesMagic      = 0x56303138
)

// MissingFile is a regular file an image's process had open or mapped that this host lacks.
type MissingFile struct {
	Path string
	// PID is the first process, in the image's numbering and pstree order, that used it;
	// 0 when only a process's working directory or root named it.
	PID int
	// FD is its descriptor in PID; -1 when PID only mapped it (its program or a library).
	FD int
}

// CRIU's VMA status bits of file mappings (criu/include/image.h).
const vmaFileMapped = 1<<6 | 1<<7 // VMA_FILE_PRIVATE | VMA_FILE_SHARED

// MissingFiles lists the regular files the image's processes had open or mapped that do not
// exist on this host, sorted by path, each with a process that used it: on another host
// CRIU would fail halfway, naming only the file. Files CRIU carried inside the image
// (deleted or unlinked files, listed in remap-fpath.img) are not needed here and are left
// out. A tree that had its own mount namespace (mountpoints images) is not checked: its
// paths are not this host's.
func MissingFiles(dir string) ([]MissingFile, error) {
	fsys, n, paths, err := reopenedOnHost(dir)
	if err != nil || paths == nil {
		return nil, err
	}
	// Each file a process uses, with its user: the first process that held it as a
	// descriptor, else the first that mapped or ran it, else none (a working or root
	// directory: PID 0). A file no process uses so (a pty CRIU recreates by its index, a
	// render node the AMD plugin places) is not reopened by its path, and not asked for.
	users := map[uint32]*MissingFile{}
	var order []uint32
	err = eachUse(n, fsys, func(u fileUse) {
		p, ok := paths[u.id]
		if !ok {
			return
		}
		m := users[u.id]
		if m == nil {
			m = &MissingFile{Path: p, FD: -1}
			users[u.id], order = m, append(order, u.id)
		}
		if u.kind != useCwd && u.kind != useRoot && (m.PID == 0 || m.FD < 0 && u.fd >= 0) {
			m.PID, m.FD = u.pid, u.fd
		}
	})
	if err != nil {
		return nil, err
	}
	byPath := map[string]*MissingFile{}
	for _, id := range order {
		m := users[id]
		if prev, ok := byPath[m.Path]; ok {
			if prev.PID == 0 || prev.FD < 0 && m.FD >= 0 {
				byPath[m.Path] = m
			}
			continue
		}
		if _, err := os.Lstat(m.Path); errors.Is(err, os.ErrNotExist) {
			byPath[m.Path] = m
		}
	}
	if len(byPath) == 0 {
		return nil, nil
	}
	out := make([]MissingFile, 0, len(byPath))
	for _, m := range byPath {
		out = append(out, *m)
	}
	slices.SortFunc(out, func(a, b MissingFile) int { return strings.Compare(a.Path, b.Path) })
	return out, nil
}

// reopenedOnHost reads the image at dir for what CRIU reopens by path on this host
// (reopenedPaths), and returns it with the image and the reading's budget; nothing for a
// tree that had its own mount namespace, whose paths are not this host's.
func reopenedOnHost(dir string) (fs.FS, *budget, map[uint32]string, error) {
	if OwnMounts(dir) {
		return nil, nil, nil, nil
	}
	fsys, n := beneath.FS(dir), newBudget()
	paths, err := reopenedPaths(n, fsys)
	return fsys, n, paths, err
}

// reopenedPaths are the regular files (and directories) of the image's files.img that CRIU
// reopens by path on restore, by their files.img ID: all but those it carries inside the
// image (deleted or unlinked files, listed in remap-fpath.img).
func reopenedPaths(n *budget, fsys fs.FS) (map[uint32]string, error) {
	entries, err := decode(n, fsys, "files.img", &fdinfo.FileEntry{})
	if err != nil {
		return nil, err
	}
	carried := map[uint32]bool{}
	// Only a file that is not there is none: one that cannot be read (a FIFO, a symlink in
	// its place) is an error, not files the image does not carry (review).
	switch _, err := fs.Stat(fsys, "remap-fpath.img"); {
	case err == nil:
		remaps, err := decode(n, fsys, "remap-fpath.img", &remap_file_path.RemapFilePathEntry{})
		if err != nil {
			return nil, err
		}
		for _, r := range remaps {
			carried[r.GetOrigId()] = true
		}
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("remap-fpath.img: %w", err)
	}
	paths := map[uint32]string{}
	for _, e := range entries {
		if reg := e.GetReg(); reg != nil && !carried[reg.GetId()] {
			paths[reg.GetId()] = path.Clean("/" + reg.GetName())
		}
	}
	// A named FIFO's descriptor names its own entry, whose path is a regular file entry's.
	for _, e := range entries {
		if f := e.GetFifo(); f != nil {
			if p, ok := paths[f.GetRegfId()]; ok {
				paths[e.GetId()] = p
			}
		}
	}
	return paths, nil
}

// How a process uses a file of files.img.
type useKind int

const (
	useFD   useKind = iota // an open descriptor
	useExe                 // its program
	useMap                 // a file mapping
	useCwd                 // its working directory
	useRoot                // its root directory
)

// fileUse is one use of a file of files.img by a process of the image.
type fileUse struct {
	kind  useKind
	pid   int    // in the image's numbering
	id    uint32 // the file's files.img ID
	fd    int    // the descriptor; -1 for any other use
	start uint64 // where a mapping starts
}

// vmaExtPlugin marks a mapping a CRIU plugin restores (a GPU's render node, mapped anew onto
// the GPU the restore places the process on): not the file the image names.
const vmaExtPlugin = 1 << 27

// eachUse hands use every descriptor, working and root directory, program and file mapping
// of the image's processes, in pstree order, each process's descriptors first. A zombie has
// none.
func eachUse(n *budget, fsys fs.FS, use func(fileUse)) error {
	tree, err := decode(n, fsys, "pstree.img", &pstree.PstreeEntry{})
	if err != nil {
		return err
	}
	for _, t := range tree {
		pid := int(t.GetPid())
		ids, err := decode(n, fsys, fmt.Sprintf("ids-%d.img", pid), &criu_core.TaskKobjIdsEntry{})
		if errors.Is(err, fs.ErrNotExist) {
			continue // a zombie: its core alone
		}
		if err != nil {
			return err
		}
		if len(ids) > 0 {
			fds, err := decode(n, fsys, fmt.Sprintf("fdinfo-%d.img", ids[0].GetFilesId()), &fdinfo.FdinfoEntry{})
			if err != nil {
				return err
			}
			for _, fd := range fds {
				use(fileUse{kind: useFD, pid: pid, id: fd.GetId(), fd: int(fd.GetFd())})
			}
		}
		dirs, err := decode(n, fsys, fmt.Sprintf("fs-%d.img", pid), &fsimg.FsEntry{})
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		for _, d := range dirs {
			use(fileUse{kind: useCwd, pid: pid, id: d.GetCwdId(), fd: -1})
			use(fileUse{kind: useRoot, pid: pid, id: d.GetRootId(), fd: -1})
		}
		mms, err := decode(n, fsys, fmt.Sprintf("mm-%d.img", pid), &mm.MmEntry{})
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		for _, e := range mms {
			use(fileUse{kind: useExe, pid: pid, id: e.GetExeFileId(), fd: -1})
			for _, v := range e.GetVmas() {
				if v.GetStatus()&vmaFileMapped != 0 && v.GetStatus()&vmaExtPlugin == 0 {
					use(fileUse{kind: useMap, pid: pid, id: uint32(v.GetShmid()), fd: -1, start: v.GetStart()})
				}
			}
		}
	}
	return nil
}

// ReadMm reads the mm image at path: one process's memory map, one entry.
func ReadMm(path string) (*mm.MmEntry, error) {
	name := filepath.Base(path)
	e, err := decode(newBudget(), beneath.FS(filepath.Dir(path)), name, &mm.MmEntry{})
	if err != nil {
		return nil, err
	}
	if len(e) != 1 {
		return nil, fmt.Errorf("read %s: %d entries, an mm image has one", name, len(e))
	}
	return e[0], nil
}

// OwnMounts says whether the image's tree had a mount namespace of its own (CRIU dumped
// its mounts): only a container runtime, which gives CRIU the container's root, can
// restore that.
func OwnMounts(dir string) bool {
	mnts, _ := filepath.Glob(filepath.Join(dir, "mountpoints-*.img"))
	return len(mnts) > 0
}

// ParentDeathSignal is the signal the image's root process had asked for when its parent
// dies (prctl PR_SET_PDEATHSIG, as launchers such as unshare --kill-child set it), 0 for
// none. CRIU restores it, and the root's parent in a restore is CRIU, which exits as soon
// as the tree runs.
func ParentDeathSignal(dir string) (int, error) {
	fsys, n := beneath.FS(dir), newBudget()
	tree, err := decode(n, fsys, "pstree.img", &pstree.PstreeEntry{})
	if err != nil {
		return 0, err
	}
	if len(tree) == 0 {
		return 0, errors.New("read pstree.img: no processes")
	}
	name := fmt.Sprintf("core-%d.img", tree[0].GetPid())
	core, err := decode(n, fsys, name, &criu_core.CoreEntry{})
	if err != nil {
		return 0, err
	}
	if len(core) == 0 {
		return 0, fmt.Errorf("read %s: no entries", name)
	}
	return int(core[0].GetThreadCore().GetPdeathSig()), nil
}

// ThreadIDs maps the IDs of the image's threads, other than each process's main thread
// (its PID), to the PID of their process: CRIU restores them as they were, and fails
// halfway, creating the processes first, when one is taken.
func ThreadIDs(dir string) (map[int]int, error) {
	tree, err := decode(newBudget(), beneath.FS(dir), "pstree.img", &pstree.PstreeEntry{})
	if err != nil {
		return nil, err
	}
	out := map[int]int{}
	for _, t := range tree {
		for _, tid := range t.GetThreads() {
			if tid != t.GetPid() {
				out[int(tid)] = int(t.GetPid())
			}
		}
	}
	return out, nil
}

// LinkRemaps are the paths of the links CRIU's image at dir restores files through: the
// links `--link-remap` made beside files held under a path deleted while they had another
// name (remap-fpath.img's linked remaps), absolute, as this host names them.
func LinkRemaps(dir string) ([]string, error) {
	fsys, n := beneath.FS(dir), newBudget()
	remaps, err := decode(n, fsys, "remap-fpath.img", &remap_file_path.RemapFilePathEntry{})
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	entries, err := decode(n, fsys, "files.img", &fdinfo.FileEntry{})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range remaps {
		if r.GetRemapType() != remap_file_path.RemapType_LINKED {
			continue
		}
		for _, e := range entries {
			if reg := e.GetReg(); reg != nil && reg.GetId() == r.GetRemapId() {
				out = append(out, path.Clean("/"+reg.GetName()))
			}
		}
	}
	return out, nil
}
