package criuimg

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/crit"
	criu_core "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fown"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pagemap"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pipe"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pstree"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/regfile"
	sk_opts "github.com/checkpoint-restore/go-criu/v7/crit/images/sk-opts"
	sk_unix "github.com/checkpoint-restore/go-criu/v7/crit/images/sk-unix"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/stats"
	"github.com/checkpoint-restore/go-criu/v7/magic"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/internal/fuzzcheck"
)

func owner() *fown.FownEntry {
	return &fown.FownEntry{Uid: proto.Uint32(0), Euid: proto.Uint32(0), Signum: proto.Uint32(0), PidType: proto.Uint32(0), Pid: proto.Uint32(0)}
}

// imageFiles are the six files Read reads for a one-process tree (PID 1, files id 1), in
// FuzzRead's argument order.
var imageFiles = []string{"pstree.img", "core-1.img", "pagemap-1.img", "ids-1.img", "fdinfo-1.img", "files.img"}

// sampleImage is a one-process image as CRIU writes it: a regular file, a pipe and a
// socket open, two runs of pages and a hole.
func sampleImage(t testing.TB) [][]byte {
	u32 := proto.Uint32
	tree := fuzzcheck.Image(t, "PSTREE", &pstree.PstreeEntry{Pid: u32(1), Ppid: u32(0), Pgid: u32(1), Sid: u32(1), Threads: []uint32{1, 2}})
	core := fuzzcheck.Image(t, "CORE", &criu_core.CoreEntry{
		Mtype: criu_core.CoreEntry_X86_64.Enum(),
		Tc: &criu_core.TaskCoreEntry{TaskState: u32(1), ExitCode: u32(0), Personality: u32(0), Flags: u32(0),
			BlkSigset: proto.Uint64(0), Comm: proto.String("sleep")},
	})
	pm := fuzzcheck.Image(t, "PAGEMAP", &pagemap.PagemapHead{PagesId: u32(1)},
		&pagemap.PagemapEntry{Vaddr: proto.Uint64(0x400000), NrPages: u32(3), Flags: u32(4)},
		&pagemap.PagemapEntry{Vaddr: proto.Uint64(0x7f0000000000), NrPages: u32(1), Flags: u32(1)},
		&pagemap.PagemapEntry{Vaddr: proto.Uint64(0x7f0000400000), NrPages: u32(512), Flags: u32(4)})
	ids := fuzzcheck.Image(t, "IDS", &criu_core.TaskKobjIdsEntry{VmId: u32(1), FilesId: u32(1), FsId: u32(1), SighandId: u32(1)})
	fds := fuzzcheck.Image(t, "FDINFO",
		&fdinfo.FdinfoEntry{Id: u32(1), Flags: u32(0), Type: fdinfo.FdTypes_REG.Enum(), Fd: u32(0)},
		&fdinfo.FdinfoEntry{Id: u32(2), Flags: u32(0), Type: fdinfo.FdTypes_PIPE.Enum(), Fd: u32(1)},
		&fdinfo.FdinfoEntry{Id: u32(3), Flags: u32(0), Type: fdinfo.FdTypes_UNIXSK.Enum(), Fd: u32(2)},
		&fdinfo.FdinfoEntry{Id: u32(9), Flags: u32(0), Type: fdinfo.FdTypes_UND.Enum(), Fd: u32(3)})
	files := fuzzcheck.Image(t, "FILES",
		&fdinfo.FileEntry{Type: fdinfo.FdTypes_REG.Enum(), Id: u32(1), Reg: &regfile.RegFileEntry{
			Id: u32(1), Flags: u32(0), Pos: proto.Uint64(0), Fown: owner(), Name: proto.String("/dev/null")}},
		&fdinfo.FileEntry{Type: fdinfo.FdTypes_PIPE.Enum(), Id: u32(2), Pipe: &pipe.PipeEntry{
			Id: u32(2), PipeId: u32(77), Flags: u32(0), Fown: owner()}},
		&fdinfo.FileEntry{Type: fdinfo.FdTypes_UNIXSK.Enum(), Id: u32(3), Usk: &sk_unix.UnixSkEntry{
			Id: u32(3), Ino: u32(1234), Type: u32(1), State: u32(1), Flags: u32(0), Uflags: u32(0),
			Backlog: u32(0), Peer: u32(0), Fown: owner(), Name: []byte{}, Opts: &sk_opts.SkOptsEntry{
				SoSndbuf: u32(0), SoRcvbuf: u32(0), SoSndTmoSec: proto.Uint64(0), SoSndTmoUsec: proto.Uint64(0),
				SoRcvTmoSec: proto.Uint64(0), SoRcvTmoUsec: proto.Uint64(0)}}})
	return [][]byte{tree, core, pm, ids, fds, files}
}

// The image files Read decodes come from the image, which anyone can write: whatever they
// hold, Read returns an error or a summary that adds up, never panics, and allocates in
// proportion to the files, not to the sizes their entry headers claim.
func FuzzRead(f *testing.F) {
	valid := sampleImage(f)
	f.Add(valid[0], valid[1], valid[2], valid[3], valid[4], valid[5])
	// Each file in turn: empty, only its magic, cut short, and an entry claiming 4 GiB.
	for i := range valid {
		for _, variant := range [][]byte{
			nil,
			valid[i][:8],
			valid[i][:len(valid[i])-1],
			append(slices.Clone(valid[i][:8]), 0xff, 0xff, 0xff, 0xff, 8, 1),
		} {
			in := slices.Clone(valid)
			in[i] = variant
			f.Add(in[0], in[1], in[2], in[3], in[4], in[5])
		}
	}
	dir := f.TempDir()
	for i, b := range valid {
		if err := os.WriteFile(filepath.Join(dir, imageFiles[i]), b, 0o600); err != nil {
			f.Fatal(err)
		}
	}
	if s, err := Read(dir); err != nil || len(s.Processes) != 1 || s.Processes[0].Command != "sleep" ||
		s.MemoryBytes < 515*PageSize || len(s.Processes[0].Files) != 4 {
		f.Fatalf("the sample image reads as %+v, %v", s, err)
	}
	f.Fuzz(func(t *testing.T, tree, core, pm, ids, fds, files []byte) {
		in := [][]byte{tree, core, pm, ids, fds, files}
		size := 0
		for i, b := range in {
			if err := os.WriteFile(filepath.Join(dir, imageFiles[i]), b, 0o600); err != nil {
				t.Fatal(err)
			}
			size += len(b)
		}
		var s *Summary
		var err error
		if n := fuzzcheck.Allocated(func() { s, err = Read(dir) }); n > fuzzcheck.AllocSlack+uint64(1024*size) {
			t.Fatalf("Read allocated %d bytes for %d bytes of images", n, size)
		}
		if err != nil {
			if s != nil {
				t.Fatalf("Read returned a summary and the error %v", err)
			}
			return
		}
		procs, err := decode(newBudget(), os.DirFS(dir), "pstree.img", &pstree.PstreeEntry{})
		if err != nil {
			t.Fatalf("Read succeeded but pstree.img does not decode: %v", err)
		}
		if len(s.Processes) == 0 || len(s.Processes) != len(procs) {
			t.Fatalf("%d processes summarized, pstree.img has %d", len(s.Processes), len(procs))
		}
		var total uint64
		for i, p := range s.Processes {
			if p.PID != int(procs[i].GetPid()) || p.PPID != int(procs[i].GetPpid()) || p.Threads != len(procs[i].GetThreads()) {
				t.Errorf("process %d = %+v, pstree.img says %v", i, p, procs[i])
			}
			if p.MemoryBytes%PageSize != 0 {
				t.Errorf("process %d: %d bytes of memory, not whole pages", p.PID, p.MemoryBytes)
			}
			total += p.MemoryBytes
			for _, o := range p.Files {
				if o.Type == "" || o.Type != strings.ToLower(o.Type) {
					t.Errorf("process %d fd %d: type %q", p.PID, o.FD, o.Type)
				}
			}
		}
		if total != s.MemoryBytes {
			t.Errorf("processes hold %d bytes, the summary says %d", total, s.MemoryBytes)
		}
		again, err := Read(dir)
		if err != nil || !reflect.DeepEqual(again, s) {
			t.Errorf("a second Read gave %+v, %v; the first %+v", again, err, s)
		}
		missing, err := MissingFiles(dir)
		paths := make([]string, len(missing))
		for i, m := range missing {
			paths[i] = m.Path
		}
		if err == nil && (!slices.IsSorted(paths) || len(slices.Compact(slices.Clone(paths))) != len(paths)) {
			t.Errorf("MissingFiles = %q: not sorted and distinct", paths)
		}
	})
}

// statsBytes is a stats file as CRIU writes it: the service magic, STATS, one entry.
func statsBytes(e *stats.StatsEntry) []byte {
	m := magic.LoadMagic()
	b := binary.LittleEndian.AppendUint32(nil, uint32(m.ByName["IMG_SERVICE"]))
	b = binary.LittleEndian.AppendUint32(b, uint32(m.ByName["STATS"]))
	body, err := proto.Marshal(e)
	if err != nil {
		panic(err)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(body)))
	return append(b, body...)
}

// CRIU's stats files sit in an image's logs/, which no checksum covers: gpucr inspect reads
// whatever is there. The readers return CRIU's numbers or an error, never panic.
func FuzzReadStats(f *testing.F) {
	u32, u64 := proto.Uint32, proto.Uint64
	dump := &stats.DumpStatsEntry{FreezingTime: u32(1500), FrozenTime: u32(90000), MemdumpTime: u32(3000),
		MemwriteTime: u32(40000), PagesScanned: u64(1 << 20), PagesSkippedParent: u64(0), PagesWritten: u64(4096),
		PagesLazy: u64(0)}
	restore := &stats.RestoreStatsEntry{PagesCompared: u64(0), PagesSkippedCow: u64(0), ForkingTime: u32(700),
		RestoreTime: u32(250000), PagesRestored: u64(4096)}
	good := statsBytes(&stats.StatsEntry{Dump: dump, Restore: restore})
	f.Add(statsBytes(&stats.StatsEntry{Dump: dump}))
	f.Add(statsBytes(&stats.StatsEntry{Restore: restore}))
	f.Add(good)
	f.Add(good[:8])           // magics only: no entry
	f.Add(good[:10])          // a cut size
	f.Add(good[:len(good)-3]) // a cut entry
	f.Add(append(good[:8:8], 0xff, 0xff, 0xff, 0x7f))
	f.Add([]byte{})
	dir := f.TempDir()
	if err := os.WriteFile(filepath.Join(dir, crit.StatsDump), good, 0o600); err != nil {
		f.Fatal(err)
	}
	if d, err := ReadDumpStats(dir); err != nil || d == nil || d.Frozen != 90*time.Millisecond || d.PagesWritten != 4096 {
		f.Fatalf("the sample stats read as %+v, %v", d, err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, name := range []string{crit.StatsDump, crit.StatsRestore} {
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		var d *DumpStats
		var r *RestoreStats
		var derr, rerr error
		if n := fuzzcheck.Allocated(func() { d, derr = ReadDumpStats(dir); r, rerr = ReadRestoreStats(dir) }); n > fuzzcheck.AllocSlack+uint64(1024*len(data)) {
			t.Fatalf("reading %d bytes of stats allocated %d bytes", len(data), n)
		}
		// CRIU counts in microseconds, in 32 bits.
		const most = time.Duration(1<<32-1) * time.Microsecond
		if derr == nil && d != nil {
			for _, v := range []time.Duration{d.Freezing, d.Frozen, d.MemDump, d.MemWrite} {
				if v < 0 || v > most || v%time.Microsecond != 0 {
					t.Errorf("dump stats %+v: a time out of CRIU's range", d)
				}
			}
		}
		if rerr == nil && r != nil {
			for _, v := range []time.Duration{r.Forking, r.Restore} {
				if v < 0 || v > most || v%time.Microsecond != 0 {
					t.Errorf("restore stats %+v: a time out of CRIU's range", r)
				}
			}
		}
	})
}

// A zombie of the tree has its core image alone (CRIU restores it exited): it is read as a
// process without memory or files, not as a damaged image. CI met one in a container's dump
// ("open pagemap-13.img: no such file or directory" from gpucr inspect).
func TestReadZombie(t *testing.T) {
	u32 := proto.Uint32
	valid := sampleImage(t)
	dir := t.TempDir()
	for i, b := range valid {
		if i == 1 || i == 0 || i == len(valid)-1 { // pstree, core, files: what a zombie's tree has
			if err := os.WriteFile(filepath.Join(dir, imageFiles[i]), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	core := fuzzcheck.Image(t, "CORE", &criu_core.CoreEntry{
		Mtype: criu_core.CoreEntry_X86_64.Enum(),
		Tc: &criu_core.TaskCoreEntry{TaskState: u32(taskDead), ExitCode: u32(0), Personality: u32(0), Flags: u32(0),
			BlkSigset: proto.Uint64(0), Comm: proto.String("sleep")},
	})
	if err := os.WriteFile(filepath.Join(dir, "core-1.img"), core, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Read(dir)
	if err != nil || len(s.Processes) != 1 || s.Processes[0].MemoryBytes != 0 || s.Processes[0].Command != "sleep" {
		t.Fatalf("Read of a zombie = %+v, %v; want one process, no memory", s, err)
	}
}
