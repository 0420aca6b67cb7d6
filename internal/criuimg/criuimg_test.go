package criuimg

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"testing/fstest"
	"time"

	criu_core "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pagemap"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pstree"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/internal/fuzzcheck"
	"github.com/gpucr/gpucr/internal/hwbreak"
	"github.com/gpucr/gpucr/internal/testutil"
)

// dumpTree starts `sleep 1000 & exec sleep 1000` in a new session with no
// terminal, dumps it with the criu CLI and returns the image directory and
// the root's PID. CRIU kills the tree after a successful dump.
func dumpTree(t *testing.T) (string, int) {
	t.Helper()
	criu := os.Getenv("GPUCR_CRIU")
	if criu == "" {
		criu = "/opt/gpucr/criu/sbin/criu"
	}
	_, err := os.Stat(criu)
	if err != nil || os.Geteuid() != 0 {
		testutil.SkipOrFail(t, fmt.Sprintf("need root and criu at %s (euid %d, %v)", criu, os.Geteuid(), err))
	}

	// Nil Stdin/Stdout/Stderr: os/exec connects them to /dev/null.
	cmd := exec.Command("sh", "-c", "sleep 1000 & exec sleep 1000")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() {
		// The group is still held by pid until Wait reaps it, so it cannot
		// have been reused.
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})

	// sh forks the background sleep before it execs, so once the root's
	// comm is "sleep" both processes exist.
	deadline := time.Now().Add(10 * time.Second)
	for {
		comm, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
		if string(comm) == "sleep\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d never became sleep (comm %q)", pid, comm)
		}
		time.Sleep(10 * time.Millisecond)
	}

	dir := t.TempDir()
	out, err := hwbreak.Command(criu, "dump", "-t", strconv.Itoa(pid), "-D", dir, "-v1", "-o", "dump.log").CombinedOutput()
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "dump.log"))
		t.Fatalf("criu dump: %v\n%s\n%s", err, out, log)
	}
	return dir, pid
}

func TestReadRealDump(t *testing.T) {
	dir, pid := dumpTree(t)
	s, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}

	if len(s.Processes) != 2 {
		t.Fatalf("got %d processes, want 2: %+v", len(s.Processes), s.Processes)
	}
	root, child := s.Processes[0], s.Processes[1]
	if root.PID != pid || root.PPID != 0 || root.Command != "sleep" || root.Threads != 1 {
		t.Errorf("root = %+v, want pid %d, ppid 0, command sleep, 1 thread", root, pid)
	}
	if child.PPID != pid || child.Command != "sleep" || child.Threads != 1 {
		t.Errorf("child = %+v, want ppid %d, command sleep, 1 thread", child, pid)
	}

	// The pagemap head must not be counted: the pages CRIU wrote to the
	// pages-*.img files are exactly the pages the pagemaps list.
	written, err := filepath.Glob(filepath.Join(dir, "pages-*.img"))
	if err != nil {
		t.Fatal(err)
	}
	var size uint64
	for _, name := range written {
		fi, err := os.Stat(name)
		if err != nil {
			t.Fatal(err)
		}
		size += uint64(fi.Size())
	}
	if s.MemoryBytes == 0 || s.MemoryBytes != root.MemoryBytes+child.MemoryBytes || s.MemoryBytes != size {
		t.Errorf("memory: total %d, root %d, child %d, pages-*.img hold %d bytes",
			s.MemoryBytes, root.MemoryBytes, child.MemoryBytes, size)
	}

	for _, p := range s.Processes {
		if p.MemoryBytes == 0 {
			t.Errorf("process %d: no memory", p.PID)
		}
		got := map[int]OpenFile{}
		for _, f := range p.Files {
			got[f.FD] = f
		}
		for fd := range 3 {
			if f := got[fd]; f.Type != "reg" || f.Path != "/dev/null" {
				t.Errorf("process %d fd %d = %+v, want reg /dev/null; files %+v", p.PID, fd, f, p.Files)
			}
		}
	}
}

func TestReadNotAnImage(t *testing.T) {
	_, err := Read(t.TempDir())
	if err == nil || !errors.Is(err, fs.ErrNotExist) || !strings.HasPrefix(err.Error(), "read pstree.img: ") {
		t.Fatalf("Read(empty dir) = %v, want a missing pstree.img error", err)
	}
}

// The entries one reading of an image decodes are bounded for all its files together, and
// a descriptor table that many processes share is read once: a hostile test's image had
// every process name one fdinfo file of four million entries, and inspect took 2.8 GB.
func TestReadBoundsTheWholeImage(t *testing.T) {
	u32 := proto.Uint32
	fsys := fstest.MapFS{}
	add := func(name, magic string, entries ...proto.Message) {
		fsys[name] = &fstest.MapFile{Data: fuzzcheck.Image(t, magic, entries...)}
	}
	var tree []proto.Message
	for pid := uint32(1); pid <= 3; pid++ {
		tree = append(tree, &pstree.PstreeEntry{Pid: u32(pid), Ppid: u32(pid - 1), Pgid: u32(1), Sid: u32(1), Threads: []uint32{pid}})
		add(fmt.Sprintf("core-%d.img", pid), "CORE", &criu_core.CoreEntry{Mtype: criu_core.CoreEntry_X86_64.Enum(),
			Tc: &criu_core.TaskCoreEntry{TaskState: u32(1), ExitCode: u32(0), Personality: u32(0), Flags: u32(0),
				BlkSigset: proto.Uint64(0), Comm: proto.String("sh")}})
		add(fmt.Sprintf("pagemap-%d.img", pid), "PAGEMAP", &pagemap.PagemapHead{PagesId: u32(pid)})
		add(fmt.Sprintf("ids-%d.img", pid), "IDS", &criu_core.TaskKobjIdsEntry{VmId: u32(pid), FilesId: u32(1), FsId: u32(1), SighandId: u32(1)})
	}
	add("pstree.img", "PSTREE", tree...)
	add("files.img", "FILES")
	var fds []proto.Message
	for fd := range 40 {
		fds = append(fds, &fdinfo.FdinfoEntry{Id: u32(9), Flags: u32(0), Type: fdinfo.FdTypes_UND.Enum(), Fd: u32(uint32(fd))})
	}
	add("fdinfo-1.img", "FDINFO", fds...)
	// 3 + 3 x (core and its task core, pagemap head, ids) + 40: 55 entries and nested
	// messages, the shared table read once.
	defer func(n int) { maxEntries = n }(maxEntries)
	maxEntries = 60
	s, err := ReadFS(fsys)
	if err != nil {
		t.Fatalf("an image of 55 entries, within 60: %v", err)
	}
	for _, p := range s.Processes {
		if len(p.Files) != 40 {
			t.Fatalf("process %d: %d files, want the 40 of the table it shares", p.PID, len(p.Files))
		}
	}
	maxEntries = 50
	if _, err := ReadFS(fsys); err == nil || !strings.Contains(err.Error(), "the image's files hold more than 50 entries") {
		t.Fatalf("an image of 55 entries, within 50: %v", err)
	}
}

// One core entry of empty nested messages (its x86 thread's TLS list) is two bytes of the
// file per message and a struct of memory: a hostile pass's 64 MiB core image decoded to
// ~4.7 GB before it was refused. The messages are counted before any is made.
func TestNestedEmptyMessagesAreBounded(t *testing.T) {
	core := (&criu_core.CoreEntry{}).ProtoReflect().Descriptor()
	threadInfo := core.Fields().ByName("thread_info")
	tls := threadInfo.Message().Fields().ByName("tls").Number()
	var info []byte
	for range maxEntries + 1 {
		info = protowire.AppendTag(info, tls, protowire.BytesType)
		info = protowire.AppendBytes(info, nil)
	}
	entry := protowire.AppendBytes(protowire.AppendTag(nil, threadInfo.Number(), protowire.BytesType), info)
	img := binary.LittleEndian.AppendUint32(nil, imgCommonMagic)
	img = binary.LittleEndian.AppendUint32(img, uint32(magics.ByName["CORE"]))
	img = binary.LittleEndian.AppendUint32(img, uint32(len(entry)))
	fsys := fstest.MapFS{
		"pstree.img": &fstest.MapFile{Data: fuzzcheck.Image(t, "PSTREE",
			&pstree.PstreeEntry{Pid: proto.Uint32(1), Ppid: proto.Uint32(0), Pgid: proto.Uint32(1), Sid: proto.Uint32(1), Threads: []uint32{1}})},
		"files.img":  &fstest.MapFile{Data: fuzzcheck.Image(t, "FILES")},
		"core-1.img": &fstest.MapFile{Data: append(img, entry...)},
	}
	var err error
	n := fuzzcheck.Allocated(func() { _, err = ReadFS(fsys) })
	if err == nil || !strings.Contains(err.Error(), "read core-1.img: the image's files hold more than") {
		t.Fatalf("ReadFS = %v, want the nested messages refused", err)
	}
	if n > 64<<20 {
		t.Errorf("refusing %d MiB of image allocated %d MiB", len(entry)>>20, n>>20)
	}
}
