package criuimg

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"syscall"
	"testing"
	"time"

	criu_core "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fown"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pstree"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/regfile"
	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/internal/fuzzcheck"
	"github.com/gpucr/gpucr/internal/hwbreak"
	"github.com/gpucr/gpucr/internal/testutil"
)

// dumpWhenReady starts cmd in a session of its own (killed at the test's end), waits until
// ready says its process is set up, and dumps it with the real CRIU, leaving it running; it
// returns the process's PID and the image directory. It skips t without root or CRIU.
func dumpWhenReady(t *testing.T, cmd *exec.Cmd, ready func(pid int) bool) (int, string) {
	t.Helper()
	criu := os.Getenv("GPUCR_CRIU")
	if criu == "" {
		criu = "/opt/gpucr/criu/sbin/criu"
	}
	if _, err := os.Stat(criu); err != nil || os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "need root and criu at "+criu)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for deadline := time.Now().Add(10 * time.Second); !ready(pid); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s never got ready", cmd.Path)
		}
	}
	img := t.TempDir()
	if out, err := hwbreak.Command(criu, "dump", "-t", strconv.Itoa(pid), "-D", img, "-o", "dump.log", "--leave-running").CombinedOutput(); err != nil {
		t.Fatalf("criu dump: %v\n%s", err, out)
	}
	return pid, img
}

// An image restored where its files are not: MissingFiles names each file with a process
// that used it, by descriptor where it had one (fd 3, a data file) and as a mapping where it
// only mapped it (its program). Present, nothing is missing.
func TestMissingFilesNameTheirUsers(t *testing.T) {
	src, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	prog, data := filepath.Join(dir, "sleep-copy"), filepath.Join(dir, "data")
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	testutil.WriteFile(t, prog, b)
	if err := os.Chmod(prog, 0o755); err != nil {
		t.Fatal(err)
	}
	testutil.WriteFile(t, data, []byte("input"))
	f, err := os.Open(data)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(prog, "1000")
	cmd.ExtraFiles = []*os.File{f} // fd 3
	pid, img := dumpWhenReady(t, cmd, func(pid int) bool {
		exe, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
		return exe == prog
	})
	if missing, err := MissingFiles(img); err != nil || missing != nil {
		t.Fatalf("with every file here: %v, %v", missing, err)
	}
	for _, p := range []string{prog, data} {
		if err := os.Rename(p, p+".away"); err != nil {
			t.Fatal(err)
		}
	}
	missing, err := MissingFiles(img)
	want := []MissingFile{{Path: data, PID: pid, FD: 3}, {Path: prog, PID: pid, FD: -1}}
	if err != nil || !reflect.DeepEqual(missing, want) {
		t.Errorf("MissingFiles = %+v, %v; want %+v", missing, err, want)
	}
}

// Only files a process holds, maps, runs or works in are reopened by their path: a pty slave
// CRIU recreates by its index, or a render node a GPU plugin places, is listed in files.img
// without being one of them, and is not asked for.
func TestMissingFilesAsksOnlyForFilesInUse(t *testing.T) {
	u32 := proto.Uint32
	owner := &fown.FownEntry{Uid: u32(0), Euid: u32(0), Signum: u32(0), PidType: u32(0), Pid: u32(0)}
	reg := func(id uint32, name string) proto.Message {
		return &fdinfo.FileEntry{Type: fdinfo.FdTypes_REG.Enum(), Id: u32(id), Reg: &regfile.RegFileEntry{
			Id: u32(id), Flags: u32(0), Pos: proto.Uint64(0), Fown: owner, Name: proto.String(name)}}
	}
	dir := t.TempDir()
	for name, b := range map[string][]byte{
		"pstree.img": fuzzcheck.Image(t, "PSTREE", &pstree.PstreeEntry{Pid: u32(1), Ppid: u32(0), Pgid: u32(1), Sid: u32(1), Threads: []uint32{1}}),
		"ids-1.img":  fuzzcheck.Image(t, "IDS", &criu_core.TaskKobjIdsEntry{VmId: u32(1), FilesId: u32(1), FsId: u32(1), SighandId: u32(1)}),
		"fdinfo-1.img": fuzzcheck.Image(t, "FDINFO",
			&fdinfo.FdinfoEntry{Id: u32(1), Flags: u32(0), Type: fdinfo.FdTypes_REG.Enum(), Fd: u32(3)}),
		"files.img": fuzzcheck.Image(t, "FILES", reg(1, "/nonexistent/held"), reg(2, "/dev/pts/4242")),
	} {
		testutil.WriteFile(t, filepath.Join(dir, name), b)
	}
	missing, err := MissingFiles(dir)
	if want := []MissingFile{{Path: "/nonexistent/held", PID: 1, FD: 3}}; err != nil || !reflect.DeepEqual(missing, want) {
		t.Fatalf("MissingFiles = %+v, %v; want only the file held, %+v", missing, err, want)
	}
	// The owners a checkpoint records are of the same files: a shell job's pty, another
	// user's login at the restore, had the restore refused (review).
	opened, err := OpenedFiles(dir)
	if paths := PathsOf(opened); err != nil || !reflect.DeepEqual(paths, []string{"/nonexistent/held"}) {
		t.Fatalf("PathsOf(OpenedFiles) = %q, %v; want only the file held", paths, err)
	}
}
