package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/gpucr/gpucr/internal/testutil"
)

// Jobs that share memory or pass messages the way Python's multiprocessing and other IPC
// do (hostile test, 2026-11-28). Each script counts into DIR/count, as the counter does,
// and keeps part of its state in what is under test: a count that goes on after a restore
// proves that state came back as it was.

// startPython starts script with python3 in a session of its own, arguments dir and then
// args, and waits for its first count; the test's end kills its whole process group (a
// restored tree keeps the group).
func startPython(t *testing.T, script string, args ...string) *workload {
	t.Helper()
	return startPythonUnder(t, nil, script, args...)
}

// startPythonUnder is startPython with python3 run by the command wrapper (unshare --ipc).
func startPythonUnder(t *testing.T, wrapper []string, script string, args ...string) *workload {
	t.Helper()
	w := &workload{dir: t.TempDir()}
	argv := slices.Concat(wrapper, []string{"python3", "-c", script, w.dir}, args)
	w.cmd = exec.Command(argv[0], argv[1:]...)
	w.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := w.cmd.Start(); err != nil {
		testutil.SkipOrFail(t, "python3: "+err.Error())
	}
	w.pid = w.cmd.Process.Pid
	go w.cmd.Wait() //nolint:errcheck // reaps the original when CRIU kills it
	t.Cleanup(func() { _ = syscall.Kill(-w.pid, syscall.SIGKILL); testutil.KillAndReap(w.pid) })
	w.waitCount(t, 1)
	return w
}

// countLoop is the scripts' common end: each step checks the job's state (check), moves it
// on (step), and writes the step's number; a state found wrong ends the job.
const countLoop = `
def count(check, step):
    i = 0
    while True:
        if not check(i):
            open(os.path.join(d, "broken"), "w").write("state wrong at %d\n" % i)
            sys.exit(1)
        i += 1
        step(i)
        with open(os.path.join(d, "count.tmp"), "w") as f:
            f.write("%d\n" % i)
        os.rename(os.path.join(d, "count.tmp"), os.path.join(d, "count"))
        time.sleep(0.02)
`

// glibc's sem_open makes a semaphore's file under a temporary name in /dev/shm, links it to
// the semaphore's name and unlinks the first, so its creator maps a file deleted from its
// path that still has a name. Python's multiprocessing leaves its Locks, Queues and Pools
// so under the spawn and forkserver start methods, and every checkpoint of such a job
// failed on CRIU's "Can't create link remap ... Use link-remap option" after a --dry-run
// that found nothing (hostile test); CRIU's link-remap leaves a link beside the file that
// its first restore consumes. gpucr carries the file in the image and makes the link again
// before each restore: the job restores from one image again and again, its semaphore's
// file there or gone.
func TestSemaphoreOfSpawnedMultiprocessingRestoresAgain(t *testing.T) {
	// forkserver is Linux's default start method since Python 3.14: its server process,
	// in the tree, forks the children.
	for _, method := range []string{"spawn", "forkserver"} {
		t.Run(method, func(t *testing.T) {
			needCRIU(t)
			w := startPython(t, `import multiprocessing as mp, os, sys, time
d = sys.argv[1]
open(os.path.join(d, "child.py"), "w").write("""import time
def run(lock):
    while True:
        with lock:
            pass
        time.sleep(0.02)
""")
sys.path.insert(0, d)
import child
`+countLoop+`
if __name__ == "__main__":
    ctx = mp.get_context("`+method+`")
    lock = ctx.Lock()
    open(os.path.join(d, "semaphore"), "w").write(lock._semlock.name)
    p = ctx.Process(target=child.run, args=(lock,), daemon=True)
    p.start()
    count(lambda i: lock.acquire(timeout=5), lambda i: lock.release())
`)
			name, err := os.ReadFile(filepath.Join(w.dir, "semaphore"))
			if err != nil {
				t.Fatal(err)
			}
			// Killed, the job leaves its semaphore's file in /dev/shm ("sem." and its name).
			sem := "/dev/shm/sem." + strings.TrimPrefix(string(name), "/")
			t.Cleanup(func() { os.Remove(sem) })
			if out, code := gpucr(t, "checkpoint", strconv.Itoa(w.pid), "--dry-run"); code != 0 || strings.Contains(out, "deleted-but-linked") ||
				!strings.Contains(out, "carried: "+sem+": a POSIX semaphore") {
				t.Errorf("dry run: exit %d, want 0, no finding, and the semaphore carried:\n%s", code, out)
			}
			noLinksLeft := func(what string) {
				if left, _ := filepath.Glob("/dev/shm/link_remap.*"); len(left) > 0 {
					t.Errorf("%s left CRIU's links %v outside the image", what, left)
				}
			}
			mustGpucr(t, "checkpoint", strconv.Itoa(w.pid), "-D", filepath.Join(t.TempDir(), "running"), "--leave-running")
			noLinksLeft("the checkpoint --leave-running")
			w.checkCountsOn(t, "the checkpoint --leave-running")
			img := filepath.Join(t.TempDir(), "img")
			mustGpucr(t, "checkpoint", strconv.Itoa(w.pid), "-D", img)
			testutil.WaitGone(t, w.pid)
			noLinksLeft("the checkpoint")
			at := w.read(t, "count")
			for _, when := range []string{"first", "second", "semaphore's file removed"} {
				if when == "semaphore's file removed" {
					// Changed, as a job run on from the image would leave it: refused, and kept.
					if err := os.WriteFile(sem, []byte("changed"), 0o600); err != nil {
						t.Fatal(err)
					}
					if out, code := gpucr(t, "restore", "-D", img); code != exitFailed || !oneLineWith(out, "remove it if no process uses it") {
						t.Fatalf("restore with the semaphore changed: exit %d, want %d and one line saying what to do:\n%s", code, exitFailed, out)
					}
					if err := os.Remove(sem); err != nil {
						t.Fatal(err)
					}
				}
				// The count loop's file the job may have held open at the checkpoint (empty,
				// its bytes still in Python's buffer), which a restore's run on renamed away:
				// the image needs it, as CRIU reopens it by path (CI: the second restore
				// refused, "a file the image needs is missing").
				if f, err := os.OpenFile(filepath.Join(w.dir, "count.tmp"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644); err == nil {
					f.Close()
				}
				w.pid = restore(t, img)
				w.waitCount(t, at+5)
				w.checkCountsOn(t, "the "+when+" restore")
				// Reaped, root and children: the next restore needs their PIDs.
				members := groupMembers(w.pid)
				_ = syscall.Kill(-w.pid, syscall.SIGKILL)
				for _, pid := range members {
					testutil.WaitReaped(t, pid)
				}
			}
		})
	}
}

// groupMembers lists the processes whose process group is pgid.
func groupMembers(pgid int) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if g, err := syscall.Getpgid(pid); err == nil && g == pgid {
			out = append(out, pid)
		}
	}
	return out
}

// A job keeping its state in a file it maps shared (multiprocessing.shared_memory in
// /dev/shm, a numpy memmap) checkpointed with --leave-running: CRIU saves the file's path,
// not its bytes, the job ran on and changed it, and the restored job found its shared
// counter ahead of its own and failed, after a checkpoint and a restore that both said
// they succeeded (hostile test). Refused now, naming the file; a checkpoint that ends the
// job keeps the file as it was, and restores.
func TestSharedMemoryOfAJobLeftRunningIsRefused(t *testing.T) {
	needCRIU(t)
	name := "gpucr-e2e-" + strconv.Itoa(os.Getpid())
	t.Cleanup(func() { os.Remove("/dev/shm/" + name) })
	w := startPython(t, `import os, sys, time
from multiprocessing import shared_memory
d = sys.argv[1]
shm = shared_memory.SharedMemory(name=sys.argv[2], create=True, size=8)
`+countLoop+`
def step(i):
    shm.buf[0] = i % 256
count(lambda i: shm.buf[0] == i % 256, step)
`, name)
	img := filepath.Join(t.TempDir(), "img")
	out, code := gpucr(t, "checkpoint", strconv.Itoa(w.pid), "-D", img, "--leave-running")
	if code != exitFailed || !oneLineWith(out, "/dev/shm/"+name) || !strings.Contains(out, "(check shared-file)") {
		t.Fatalf("checkpoint --leave-running: exit %d, want %d and one line naming the file and the check:\n%s", code, exitFailed, out)
	}
	w.checkCountsOn(t, "the refusal")
	restoresCountingOn(t, w)
}

// System V shared memory attached in the host's IPC namespace: CRIU saves segments only
// with an IPC namespace of the tree's own, and the checkpoint failed on "Task N with
// SysVIPC shmem map @ADDR doesn't live in IPC ns" after a --dry-run that found nothing
// (hostile test). Refused now with what to do; done as said (unshare --ipc), the job is
// checkpointed and restored with its segment.
func TestSysVSharedMemoryNeedsAnIPCNamespaceOfItsOwn(t *testing.T) {
	needCRIU(t)
	script := `import ctypes, os, sys, time
d = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
seg = libc.shmget(0, 4096, 0o600)  # IPC_PRIVATE
addr = libc.shmat(seg, None, 0)
libc.shmctl(seg, 0, None)  # IPC_RMID: gone once detached, even if the job is killed
cell = ctypes.c_uint32.from_address(addr)
` + countLoop + `
def step(i):
    cell.value = i
count(lambda i: cell.value == i, step)
`
	w := startPython(t, script)
	out, code := gpucr(t, "checkpoint", strconv.Itoa(w.pid), "-D", filepath.Join(t.TempDir(), "img"))
	if code != exitFailed || !oneLineWith(out, "unshare --ipc") || !strings.Contains(out, "(check sysv-shm)") {
		t.Errorf("checkpoint: exit %d, want %d and one line saying to unshare the IPC namespace:\n%s", code, exitFailed, out)
	}
	w.checkCountsOn(t, "the refusal")

	restoresCountingOn(t, startPythonUnder(t, []string{"unshare", "--ipc"}, script))
}

// restoresCountingOn checkpoints w's job, which stops it, restores it, and checks that it
// counts on with its state as it was.
func restoresCountingOn(t *testing.T, w *workload) {
	t.Helper()
	img := filepath.Join(t.TempDir(), "img")
	mustGpucr(t, "checkpoint", strconv.Itoa(w.pid), "-D", img)
	testutil.WaitGone(t, w.pid)
	at := w.read(t, "count")
	w.pid = restore(t, img)
	w.waitCount(t, at+5)
	w.checkCountsOn(t, "the restore")
}

// A POSIX message queue (mq_open): CRIU does not dump the mqueue file system, and the
// checkpoint failed on "Can't lookup mount=N for fd=3 path=/NAME", which says nothing a
// user can act on, after a --dry-run that found nothing (hostile test). Refused now, naming
// the queue.
func TestPOSIXMessageQueueIsRefusedUpFront(t *testing.T) {
	needCRIU(t)
	name := "/gpucr-e2e-" + strconv.Itoa(os.Getpid())
	w := startPython(t, `import ctypes, os, sys, time
d = sys.argv[1]
rt = ctypes.CDLL("librt.so.1", use_errno=True)
q = rt.mq_open(sys.argv[2].encode(), os.O_CREAT | os.O_RDWR, 0o600, None)
rt.mq_unlink(sys.argv[2].encode())  # gone with the job, even if it is killed
buf = ctypes.create_string_buffer(8192)
`+countLoop+`
def check(i):
    return i == 0 or rt.mq_receive(q, buf, 8192, None) == len(str(i)) and buf.value == str(i).encode()
count(check, lambda i: rt.mq_send(q, str(i).encode(), len(str(i)), 0))
`, name)
	out, code := gpucr(t, "checkpoint", strconv.Itoa(w.pid), "-D", filepath.Join(t.TempDir(), "img"))
	if code != exitFailed || !oneLineWith(out, "POSIX message queue "+name) || !strings.Contains(out, "(check posix-mqueue)") {
		t.Errorf("checkpoint: exit %d, want %d and one line naming the queue:\n%s", code, exitFailed, out)
	}
	w.checkCountsOn(t, "the refusal")
}

// checkCountsOn fails t unless the script w runs, after what, is alive, counts on, and has
// not found its state wrong.
func (w *workload) checkCountsOn(t *testing.T, what string) {
	t.Helper()
	if !testutil.Alive(w.pid) {
		t.Fatalf("the job died after %s", what)
	}
	w.waitCount(t, w.read(t, "count")+3)
	if b, err := os.ReadFile(filepath.Join(w.dir, "broken")); err == nil {
		t.Fatalf("after %s the job found: %s", what, b)
	}
}

// A job connected through a unix stream socket to a supervisor outside its tree cannot be
// checkpointed (CRIU dumps no half of a connection, --ext-unix-sk or not); the refusal said
// only CRIU's "Can't dump half of stream unix connection" (hostile test). It now names the
// supervisor's socket and what to do, in one line, and the job runs on.
func TestUnixConnectionToASupervisorSaysWhatToDo(t *testing.T) {
	needCRIU(t)
	sock := filepath.Join(t.TempDir(), "supervisor.sock")
	sup := startPython(t, `import os, socket, sys, threading, time
d = sys.argv[1]
`+countLoop+`
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[2]); s.listen(1)
def serve():
    c, _ = s.accept()
    while c.recv(64):
        c.sendall(b"ok")
threading.Thread(target=serve, daemon=True).start()
count(lambda i: True, lambda i: None)
`, sock)
	job := startPython(t, `import os, socket, sys, time
d = sys.argv[1]
`+countLoop+`
c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
c.connect(sys.argv[2])
def step(i):
    c.sendall(b"x")
    c.recv(64)
count(lambda i: True, step)
`, sock)
	out, code := gpucr(t, "checkpoint", strconv.Itoa(job.pid), "-D", filepath.Join(t.TempDir(), "img"), "--ext-unix-sk")
	if code != 1 || !oneLineWith(out, "connected through a unix stream socket to "+sock) || !strings.Contains(out, "checkpoint a tree that holds both ends") {
		t.Fatalf("checkpoint of a job connected to a supervisor: exit %d:\n%s", code, out)
	}
	job.waitCount(t, job.read(t, "count")+3) // it runs on, talking to its supervisor
	if !testutil.Alive(sup.pid) {
		t.Fatal("the supervisor died")
	}
}
