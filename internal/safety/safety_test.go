package safety

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/testutil"
)

// fake is one process of a fixture /proc: what its descriptors point to, the paths it
// maps, its environment and its thread names — what the probes of docs/restorability.md
// found to differ between the cases.
type fake struct {
	pid     int
	files   []string
	maps    []string
	env     []string
	threads []string
	outside bool     // a process of the host, not of the tree
	modes   string   // per descriptor, how it was opened: r, w; none or blank: both
	tcp     []string // lines of its network namespace's /proc/PID/net/tcp, below the header
}

const (
	torch = "/opt/torch/lib/libtorch_cuda.so"
	nccl  = "/opt/torch/nvidia/nccl/lib/libnccl.so.2"
)

// fixture writes procs into a new /proc-like directory and returns it with their tree.
func fixture(t *testing.T, procs ...fake) (string, []proctree.Process) {
	t.Helper()
	root := t.TempDir()
	var tree []proctree.Process
	for _, p := range procs {
		dir := filepath.Join(root, strconv.Itoa(p.pid))
		for i, f := range p.files {
			if err := os.MkdirAll(filepath.Join(dir, "fd"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(f, filepath.Join(dir, "fd", strconv.Itoa(i))); err != nil {
				t.Fatal(err)
			}
			if i < len(p.modes) && p.modes[i] != ' ' {
				flags := map[byte]string{'r': "0100000", 'w': "0100001"}[p.modes[i]]
				testutil.WriteFile(t, filepath.Join(dir, "fdinfo", strconv.Itoa(i)), []byte("pos:\t0\nflags:\t"+flags+"\n"))
			}
		}
		var maps strings.Builder
		for _, m := range p.maps {
			maps.WriteString("7f0000000000-7f0000001000 r-xp 00000000 08:01 42 " + m + "\n")
		}
		testutil.WriteFile(t, filepath.Join(dir, "maps"), []byte(maps.String()))
		testutil.WriteFile(t, filepath.Join(dir, "environ"), []byte(strings.Join(p.env, "\x00")+"\x00"))
		for i, th := range append([]string{"python3"}, p.threads...) {
			testutil.WriteFile(t, filepath.Join(dir, "task", strconv.Itoa(p.pid+i), "comm"), []byte(th+"\n"))
		}
		testutil.WriteFile(t, filepath.Join(dir, "comm"), []byte("python3\n"))
		if p.tcp != nil {
			table := "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
			testutil.WriteFile(t, filepath.Join(dir, "net", "tcp"), []byte(table+strings.Join(p.tcp, "\n")+"\n"))
		}
		if !p.outside {
			tree = append(tree, proctree.Process{PID: p.pid, Command: "python3"})
		}
	}
	return root, tree
}

func checksOf(fs []Finding) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Check+":"+strconv.Itoa(f.PID))
	}
	return out
}

func TestAnalyzeFixtures(t *testing.T) {
	gpu0, gpu1 := "GPU-0", "GPU-1"
	sockets := []string{"NCCL_P2P_DISABLE=1", "NCCL_SHM_DISABLE=1"}
	worker := func(pid int, threads ...string) fake {
		return fake{pid: pid, files: []string{"/dev/nvidiactl", "/dev/nvidia0"}, maps: []string{torch, nccl}, threads: threads}
	}
	// A python3 listener on 127.0.0.1:34287 (socket 5000) and a client connected to it that it
	// has not accepted, as the kernel's table showed them: the listener's rx_queue (its
	// accept backlog) 1, the connection completed for it on no descriptor yet (inode 0), the
	// client's end (inode 5001) held outside the tree.
	const (
		pendingListener = "   1: 0100007F:85EF 00000000:0000 0A 00000000:00000001 00:00000000 00000000     0        0 5000 2 0 100 0 0 10 0"
		idleListener    = "   1: 0100007F:85EF 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5000 1 0 100 0 0 10 0"
		unaccepted      = "  14: 0100007F:85EF 0100007F:EB9E 01 00000000:00000000 00:00000000 00000000     0        0 0 1 0 20 0 0 10 -1"
		clientEnd       = "  15: 0100007F:EB9E 0100007F:85EF 01 00000000:00000000 00:00000000 00000000     0        0 5001 2 0 20 0 0 10 -1"
	)
	listening := func(pid int, table ...string) fake {
		return fake{pid: pid, files: []string{"/dev/null", "/dev/null", "/dev/null", "socket:[5000]"}, tcp: table}
	}
	cases := []struct {
		name  string
		procs []fake
		gpus  []GPUProcess
		skip  Skips
		want  []string
	}{
		{"one process on one GPU", []fake{worker(10)}, []GPUProcess{{10, []string{gpu0}}}, nil, nil},
		{"one process on two GPUs", []fake{worker(10)}, []GPUProcess{{10, []string{gpu0, gpu1}}}, nil,
			[]string{"multi-gpu-process:10"}},
		{"one process on two GPUs, check off", []fake{worker(10)}, []GPUProcess{{10, []string{gpu0, gpu1}}},
			Skips{CheckMultiGPU: true}, nil},
		{"CUDA IPC exporter and importer", []fake{
			{pid: 10, files: []string{"/dev/nvidiactl", "/dev/shm/cuda.shm.0.a.1"}, maps: []string{torch, nccl}}, worker(11)},
			[]GPUProcess{{10, []string{gpu0}}, {11, []string{gpu0}}}, nil, []string{"cuda-ipc:10"}},
		{"two independent PyTorch workers", []fake{worker(10), worker(11)},
			[]GPUProcess{{10, []string{gpu0}}, {11, []string{gpu0}}}, nil, nil},
		{"PyTorch ranks with an NCCL process group", []fake{worker(10, "pt_nccl_watchdg"), worker(11, "pt_nccl_watchdg")},
			[]GPUProcess{{10, []string{gpu0}}, {11, []string{gpu1}}}, nil, []string{"nccl-transports:10", "nccl-transports:11"}},
		{"PyTorch ranks with NCCL over sockets", []fake{
			{pid: 10, maps: []string{torch, nccl}, env: sockets, threads: []string{"pt_nccl_watchdg"}},
			{pid: 11, maps: []string{torch, nccl}, env: sockets, threads: []string{"pt_nccl_watchdg"}}},
			[]GPUProcess{{10, []string{gpu0}}, {11, []string{gpu1}}}, nil, nil},
		{"a rank alone", []fake{worker(10, "pt_nccl_watchdg")}, []GPUProcess{{10, []string{gpu0}}}, nil, nil},
		{"other NCCL programs, which cannot be told apart", []fake{{pid: 10, maps: []string{nccl}}, {pid: 11, maps: []string{nccl}}},
			[]GPUProcess{{10, []string{gpu0}}, {11, []string{gpu1}}}, nil, []string{"nccl-transports:10", "nccl-transports:11"}},
		{"torchrun: an agent with io_uring, ranks on NCCL: NCCL first", []fake{{pid: 9, files: []string{"anon_inode:[io_uring]"}},
			worker(10, "pt_nccl_watchdg"), worker(11, "pt_nccl_watchdg")},
			[]GPUProcess{{10, []string{gpu0}}, {11, []string{gpu1}}}, nil, []string{"nccl-transports:10", "nccl-transports:11", "io-uring:9"}},
		{"io_uring in a CPU process", []fake{worker(10), {pid: 12, files: []string{"anon_inode:[io_uring]"}}},
			[]GPUProcess{{10, []string{gpu0}}}, nil, []string{"io-uring:12"}},
		{"output piped to a process outside the tree (| tee)", []fake{{pid: 10, files: []string{"/dev/null", "pipe:[77]"}},
			{pid: 20, files: []string{"pipe:[77]"}, outside: true}}, nil, nil, []string{"outer-pipe:10"}},
		{"a pipe within the tree", []fake{{pid: 10, files: []string{"pipe:[77]"}}, {pid: 11, files: []string{"pipe:[77]"}},
			{pid: 20, files: []string{"pipe:[78]"}, outside: true}}, nil, nil, nil},
		{"a launcher's pipe leaked to every process, beyond the standard descriptors", []fake{
			{pid: 10, files: []string{"/dev/null", "/dev/null", "/dev/null", "pipe:[79]"}},
			{pid: 20, files: []string{"pipe:[79]"}, outside: true}}, nil, nil, nil},
		{"a pipe outside, check off", []fake{{pid: 10, files: []string{"pipe:[77]"}}, {pid: 20, files: []string{"pipe:[77]"}, outside: true}},
			nil, Skips{CheckOuterPipe: true}, nil},
		{"output piped to a reader outside", []fake{{pid: 10, files: []string{"/dev/null", "pipe:[81]"}, modes: " w"},
			{pid: 20, files: []string{"pipe:[81]"}, modes: "r", outside: true}}, nil, nil, []string{"outer-pipe:10"}},
		{"input written from outside", []fake{{pid: 10, files: []string{"pipe:[82]"}, modes: "r"},
			{pid: 20, files: []string{"/dev/null", "pipe:[82]"}, modes: " w", outside: true}}, nil, nil, []string{"outer-pipe:10"}},
		// A script fed to bash on its stdin, its writer gone: bash and the job only read.
		{"a stdin pipe only read, inside and outside", []fake{{pid: 10, files: []string{"pipe:[83]"}, modes: "r"},
			{pid: 20, files: []string{"pipe:[83]"}, modes: "r", outside: true}}, nil, nil, nil},
		{"a listener with a connection not accepted", []fake{listening(10, pendingListener, unaccepted, clientEnd)},
			nil, nil, []string{"tcp-pending:10"}},
		{"a listener with a connection not accepted, with --tcp-established", []fake{listening(10, pendingListener, unaccepted, clientEnd)},
			nil, Skips{CheckTCP: true}, []string{"tcp-pending:10"}},
		{"a listener with nothing to accept", []fake{listening(10, idleListener)}, nil, nil, nil},
		{"a listener a server's workers share, named once", []fake{listening(10, pendingListener), listening(11, pendingListener)},
			nil, nil, []string{"tcp-pending:10"}},
		{"the client waiting to be accepted: its connection only", []fake{{pid: 10, files: []string{"socket:[5001]"},
			tcp: []string{pendingListener, unaccepted, clientEnd}}}, nil, nil, []string{"tcp-established:10"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root, tree := fixture(t, c.procs...)
			got, _ := Analyze(proctree.Snap(root, tree), c.gpus, c.skip)
			if !slices.Equal(checksOf(got), c.want) {
				t.Fatalf("findings %v, want %v", checksOf(got), c.want)
			}
			for _, f := range got {
				if f.Reason == "" || f.Fix == "" || !errors.Is(&f, ErrUnsafe) {
					t.Errorf("finding without cause or fix: %+v", f)
				}
			}
		})
	}
}

// A named FIFO is a pipe too: a job writing into one that a process outside reads died of
// SIGPIPE once restored, as with `| tee` (review).
func TestOuterFIFOIsRefused(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	root, tree := fixture(t, fake{pid: 10, files: []string{"/dev/null", fifo}, modes: " w"},
		fake{pid: 20, files: []string{fifo}, modes: "r", outside: true})
	found, _ := Analyze(proctree.Snap(root, tree), nil, nil)
	if got := checksOf(found); !slices.Equal(got, []string{"outer-pipe:10"}) {
		t.Fatalf("findings %v, want the FIFO read outside", got)
	}
}

// A FIFO is named by its path in its holder's mount namespace, where a user can mount a
// tmpfs and make a FIFO of their own at the job's FIFO's path: holding that one had root's
// checkpoint of another user's job refused (hostile test). Here the two links read alike
// ("../fifo") and lead to two FIFOs.
func TestOuterFIFOIsTheSameFileOnly(t *testing.T) {
	root, tree := fixture(t, fake{pid: 10, files: []string{"/dev/null", "../fifo"}, modes: " w"},
		fake{pid: 20, files: []string{"../fifo"}, modes: "r", outside: true})
	for _, pid := range []string{"10", "20"} {
		if err := unix.Mkfifo(filepath.Join(root, pid, "fifo"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	found, _ := Analyze(proctree.Snap(root, tree), nil, nil)
	if got := checksOf(found); len(got) != 0 {
		t.Fatalf("findings %v, want none: the process outside holds another FIFO at the path", got)
	}
}

// A listener with connections it has not accepted passed the analysis, and CRIU's dump then
// failed "In-flight connection (l)", --tcp-established or not, after a GPU job's device
// state was locked and checkpointed (review). The finding names the socket and the backlog,
// and cannot be switched off: gpucr has CRIU drop no pending connection.
func TestListenerWithPendingConnectionsIsRefused(t *testing.T) {
	root, tree := fixture(t, fake{pid: 10, files: []string{"socket:[5000]"}, tcp: []string{
		"   0: 0100007F:85EF 00000000:0000 0A 00000000:00000003 00:00000000 00000000     0        0 5000 2 0 100 0 0 10 0"}})
	got, _ := Analyze(proctree.Snap(root, tree), nil, Skips{CheckTCP: true})
	if len(got) != 1 || got[0].Check != CheckTCPPending || !strings.Contains(got[0].Reason, "listens on 127.0.0.1:34287 with 3 connection(s)") ||
		!strings.Contains(got[0].Fix, "accept") {
		t.Fatalf("findings %+v, want one naming the listener and its 3 pending connections", got)
	}
	if _, _, err := SkipsFrom([]string{CheckTCPPending}); err == nil {
		t.Fatal("tcp-pending was switched off: CRIU refuses the socket anyway")
	}
}

func TestSkipsFrom(t *testing.T) {
	s, rest, err := SkipsFrom([]string{"cuda-ipc", "driver-version"})
	if err != nil || !s[CheckCUDAIPC] || !slices.Equal(rest, []string{"driver-version"}) {
		t.Fatalf("SkipsFrom: %v %v %v", s, rest, err)
	}
	if _, _, err := SkipsFrom([]string{CheckIOURing}); err == nil {
		t.Fatal("io-uring was switched off: CRIU cannot dump it anyway")
	}
}

// The real /proc: this process holds an io_uring. (Its output is a pipe to go test.)
func TestIOURingIsRefused(t *testing.T) {
	self, err := proctree.Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	tree := []proctree.Process{self}
	pipeOK := Skips{CheckOuterPipe: true}
	if _, err := Check(proctree.Snap("/proc", tree), nil, pipeOK); err != nil {
		t.Fatalf("before io_uring: %v", err)
	}
	var params [120]byte // struct io_uring_params; the kernel fills it in
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, 4, uintptr(unsafe.Pointer(&params[0])), 0)
	if errno != 0 {
		t.Skipf("io_uring_setup: %v", errno)
	}
	defer syscall.Close(int(fd))
	_, err = Check(proctree.Snap("/proc", tree), nil, pipeOK)
	if !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "io_uring") {
		t.Fatalf("with io_uring: %v", err)
	}
}

func TestMissingEnv(t *testing.T) {
	env := []byte("A=1\x00NCCL_P2P_DISABLE=1\x00NCCL_SHM_DISABLE=0\x00")
	if got := missingEnv(env, ncclSafeEnv); !slices.Equal(got, []string{"NCCL_SHM_DISABLE=1"}) {
		t.Fatalf("missingEnv = %v", got)
	}
	env = append(env, []byte("NCCL_SHM_DISABLE=1\x00")...)
	if got := missingEnv(env, ncclSafeEnv); len(got) != 0 {
		t.Fatalf("missingEnv = %v, want none", got)
	}
}

// selfAnalyzed runs the analysis on this test process alone, outer pipes aside (its output
// is a pipe to go test), with the checks in skip off too.
func selfAnalyzed(t *testing.T, skip Skips) []string {
	t.Helper()
	self, err := proctree.Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	all := Skips{CheckOuterPipe: true}
	for k := range skip {
		all[k] = true
	}
	var out []string
	found, _ := Analyze(proctree.Snap("/proc", []proctree.Process{self}), nil, all)
	for _, f := range found {
		out = append(out, f.Check)
	}
	return out
}

// mapShared maps the file at path shared and writable, for the test's length.
func mapShared(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(4096); err != nil {
		t.Fatal(err)
	}
	b, err := unix.Mmap(int(f.Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(b) })
	return f
}

// The real /proc: a file this process maps and holds open, deleted from its path while it
// has another name, as sem_open leaves a semaphore's file; once its last name is gone too,
// CRIU saves it in the image, and it is no finding.
func TestFileDeletedButLinkedIsRefused(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	tmp, name := filepath.Join(dir, "sem.Xy12ab"), filepath.Join(dir, "sem.mp-lock")
	mapShared(t, tmp)
	if err := os.Link(tmp, name); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(tmp); err != nil {
		t.Fatal(err)
	}
	if got := selfAnalyzed(t, Skips{CheckSharedFile: true}); !slices.Equal(got, []string{CheckLinkedAway}) {
		t.Fatalf("findings %v, want %s", got, CheckLinkedAway)
	}
	if err := os.Remove(name); err != nil {
		t.Fatal(err)
	}
	if got := selfAnalyzed(t, Skips{CheckSharedFile: true}); len(got) != 0 {
		t.Fatalf("findings %v for a file deleted from every name", got)
	}
}

// The real /proc: a file mapped shared and writable is a finding of shared-file (which the
// engine switches off unless the tree is left running); one mapped privately is none.
func TestSharedFileMapping(t *testing.T) {
	needRoot(t)
	before := selfAnalyzed(t, nil)
	f := mapShared(t, filepath.Join(t.TempDir(), "psm_1"))
	if got := selfAnalyzed(t, nil); !slices.Equal(got, append(before, CheckSharedFile)) {
		t.Fatalf("findings %v, want %v and %s", got, before, CheckSharedFile)
	}
	if got := selfAnalyzed(t, Skips{CheckSharedFile: true}); !slices.Equal(got, before) {
		t.Fatalf("findings %v with the check off, want %v", got, before)
	}
	b, err := unix.Mmap(int(f.Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(b) //nolint:errcheck // the test's own mapping
	if got := selfAnalyzed(t, nil); !slices.Equal(got, append(before, CheckSharedFile)) {
		t.Fatalf("findings %v with a private mapping too", got)
	}
}

// System V shared memory is a finding only where the tree's root shares the IPC namespace
// of gpucr (procfs's self), which CRIU then does not dump.
func TestSysVShmOutsideAnIPCNamespaceOfItsOwn(t *testing.T) {
	for _, c := range []struct {
		ipc  string
		want []string
	}{{"ipc:[1]", []string{"sysv-shm:10"}}, {"ipc:[2]", nil}} {
		root, tree := fixture(t, fake{pid: 10, maps: []string{"/SYSV00000000 (deleted)"}})
		for pid, ns := range map[string]string{"self": "ipc:[1]", "10": c.ipc} {
			if err := os.MkdirAll(filepath.Join(root, pid, "ns"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(ns, filepath.Join(root, pid, "ns", "ipc")); err != nil {
				t.Fatal(err)
			}
		}
		found, _ := Analyze(proctree.Snap(root, tree), nil, nil)
		if got := checksOf(found); !slices.Equal(got, c.want) {
			t.Errorf("root in %s, gpucr in ipc:[1]: findings %v, want %v", c.ipc, got, c.want)
		}
	}
}

// needRoot skips a test that reads /proc/PID/map_files, which only root may.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "reading map_files needs root")
	}
}

// The real /proc: a POSIX message queue this process holds open, which CRIU cannot dump.
func TestPOSIXMessageQueueIsRefused(t *testing.T) {
	needRoot(t)
	before := selfAnalyzed(t, nil)
	name, err := unix.BytePtrFromString("gpucr-safety-test-" + strconv.Itoa(os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	fd, _, errno := unix.Syscall6(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(name)), unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600, 0, 0, 0)
	if errno != 0 {
		t.Skipf("mq_open: %v", errno)
	}
	defer syscall.Close(int(fd))
	defer unix.Syscall(unix.SYS_MQ_UNLINK, uintptr(unsafe.Pointer(name)), 0, 0) //nolint:errcheck // the test's own queue
	if got := selfAnalyzed(t, nil); !slices.Equal(got, append(before, CheckMQueue)) {
		t.Fatalf("findings %v, want %v and %s", got, before, CheckMQueue)
	}
}

// The real /proc and /dev/shm: this process maps a file as sem_open leaves a semaphore's
// creator, under a deleted name while the file has another. A process tree's checkpoint
// carries it (CarrySemaphores); a container's does not, nor any checkpoint while a process
// outside the tree holds the file too.
func TestSemaphoreIsCarriedForATreeOnly(t *testing.T) {
	name := fmt.Sprintf("sem.gpucr-test-%d", os.Getpid())
	tmp := filepath.Join(ShmDir, name+".tmp")
	mapShared(t, tmp)
	sem := filepath.Join(ShmDir, name)
	if err := os.Link(tmp, sem); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(sem) })
	if err := os.Remove(tmp); err != nil {
		t.Fatal(err)
	}
	if got := selfAnalyzed(t, nil); !slices.Contains(got, CheckLinkedAway) {
		t.Errorf("without carry: %v, want %s", got, CheckLinkedAway)
	}
	if got := selfAnalyzed(t, Skips{CarrySemaphores: true}); slices.Contains(got, CheckLinkedAway) {
		t.Errorf("carried: %v, want no %s", got, CheckLinkedAway)
	}
	self, err := proctree.Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	sems, err := Semaphores(proctree.Snap("/proc", []proctree.Process{self}))
	if err != nil || len(sems) != 1 || sems[0].Path != sem {
		t.Fatalf("Semaphores = %+v, %v; want %s", sems, err, sem)
	}

	f, err := os.Open(sem)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	outside := exec.Command("sleep", "60")
	outside.ExtraFiles = []*os.File{f}
	if err := outside.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = outside.Process.Kill(); _ = outside.Wait() })
	if got := selfAnalyzed(t, Skips{CarrySemaphores: true}); !slices.Contains(got, CheckLinkedAway) {
		t.Errorf("held outside the tree too: %v, want %s", got, CheckLinkedAway)
	}
}
