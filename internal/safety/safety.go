// Package safety finds, before any GPU is locked, what would make a checkpoint fail or,
// worse, succeed and never restore: a checkpoint that cannot be restored is data loss.
// Each finding names its check, the measured cause and what the user can do; the checks
// whose signal is a proxy can be switched off by name, like the GPU compatibility checks.
package safety

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gpucr/gpucr/internal/proctree"
)

// ErrUnsafe marks a tree gpucr refuses to checkpoint.
var ErrUnsafe = errors.New("cannot checkpoint safely")

// Names of the checks. The first three, outer-pipe and shared-file can be switched off
// (--skip-check NAME).
const (
	CheckNCCL        = "nccl-transports"
	CheckCUDAIPC     = "cuda-ipc"
	CheckMultiGPU    = "multi-gpu-process"
	CheckIOURing     = "io-uring"
	CheckNoCUDAState = "no-cuda-state"
	CheckOuterPipe   = "outer-pipe"
	CheckSysVShm     = "sysv-shm"
	CheckLinkedAway  = "deleted-but-linked"
	CheckMQueue      = "posix-mqueue"
	// CheckTCP is off where the checkpoint is asked to take established connections
	// (--tcp-established: the engine's skipsFor).
	CheckTCP = "tcp-established"
	// CheckTCPPending is on with --tcp-established too: CRIU refuses a listening socket
	// with connections not yet accepted either way.
	CheckTCPPending = "tcp-pending"
	// CheckSharedFile applies to a tree left running only; a checkpoint that ends the
	// tree switches it off (the engine's skipsFor).
	CheckSharedFile = "shared-file"
)

// Rule is one check of the analysis and what it is about, for --skip-check's help.
type Rule struct {
	Name      string
	About     string
	Skippable bool
}

var rules = []Rule{
	{CheckNCCL, "GPU processes of one tree using NCCL's P2P or SHM transports", true},
	{CheckCUDAIPC, "a GPU process sharing its GPU memory through CUDA IPC", true},
	{CheckMultiGPU, "one process holding CUDA contexts on more than one GPU (peer access cannot be seen from outside)", true},
	{CheckIOURing, "a process holding an io_uring instance", false},
	{CheckNoCUDAState, "a process holding NVIDIA device files without CUDA state of its own", false},
	{CheckOuterPipe, "a pipe between the tree and a process outside it (a `| tee` of the job's output)", true},
	{CheckSysVShm, "System V shared memory in the host's IPC namespace", false},
	{CheckLinkedAway, "a file held under a path it was deleted from while it has another name (a POSIX semaphore sem_open made)", false},
	{CheckMQueue, "a POSIX message queue held open", false},
	{CheckTCP, "an established TCP connection (or one connecting or closing), which CRIU checkpoints only with --tcp-established", false},
	{CheckTCPPending, "a listening TCP socket with connections not yet accepted, which CRIU cannot checkpoint", false},
	{CheckSharedFile, "with --leave-running: a file mapped shared and writable, which the job running on changes after the checkpoint", true},
}

// Rules lists the analysis's checks.
func Rules() []Rule { return slices.Clone(rules) }

// Skips are the checks switched off by name.
type Skips map[string]bool

// SkipsFrom keeps the names of names that are this package's skippable checks; the others
// are left for other packages. An unskippable check named is an error.
func SkipsFrom(names []string) (Skips, []string, error) {
	s := Skips{}
	var rest []string
	for _, n := range names {
		i := slices.IndexFunc(rules, func(r Rule) bool { return r.Name == n })
		switch {
		case i < 0:
			rest = append(rest, n)
		case !rules[i].Skippable:
			return nil, nil, fmt.Errorf("check %q cannot be switched off: CRIU cannot checkpoint what it finds", n)
		default:
			s[n] = true
		}
	}
	return s, rest, nil
}

// Finding is one reason a tree cannot be checkpointed, with what the user can do about it.
type Finding struct {
	Check   string `json:"check"`
	PID     int    `json:"pid"`
	Command string `json:"command"`
	Reason  string `json:"reason"`
	Fix     string `json:"fix"`
}

func (f *Finding) Error() string {
	return fmt.Sprintf("process %d (%s) %s; %s (check %s)", f.PID, f.Command, f.Reason, f.Fix, f.Check)
}

func (f *Finding) Is(target error) bool { return target == ErrUnsafe }

// ncclSafeEnv is what a job needs so that NCCL moves data between its processes over
// sockets only. Measured with driver 580: with NCCL's P2P (CUDA IPC) or SHM (shared pinned
// host memory) transports on, the driver locks and checkpoints every rank and then cannot
// restore any of them.
var ncclSafeEnv = []string{"NCCL_P2P_DISABLE=1", "NCCL_SHM_DISABLE=1"}

// NCCLSafeEnv returns the environment settings that make an NCCL job checkpointable.
func NCCLSafeEnv() []string { return append([]string(nil), ncclSafeEnv...) }

// GPUProcess is a process of the tree holding GPU state, and the GPUs it holds contexts on.
type GPUProcess struct {
	PID     int
	Devices []string
}

// proc is what the analysis reads of one process, once.
type proc struct {
	proctree.Process
	gpu     *GPUProcess
	files   []string // what its descriptors point to
	maps    []byte
	env     []byte
	threads []string // thread names
}

// Analyze returns every finding on the processes of tree, checks in skip excepted, and
// where skip has CarrySemaphores the semaphores the checkpoint carries instead (Semaphores):
// read here once, for the checkpoint and its dry run alike.
func Analyze(tree *proctree.Snapshot, gpus []GPUProcess, skip Skips) ([]Finding, []Semaphore) {
	procs := make([]*proc, 0, len(tree.Processes()))
	for _, p := range tree.Processes() {
		r := read(tree, p)
		if i := slices.IndexFunc(gpus, func(g GPUProcess) bool { return g.PID == p.PID }); i >= 0 {
			r.gpu = &gpus[i]
		}
		procs = append(procs, r)
	}
	var out []Finding
	add := func(check string, p *proc, reason, fix string) {
		if !skip[check] {
			out = append(out, Finding{check, p.PID, p.Command, reason, fix})
		}
	}
	nGPU := len(gpus)
	for _, p := range procs {
		if slices.Contains(p.files, "anon_inode:[io_uring]") {
			add(CheckIOURing, p, "holds an io_uring instance, which CRIU cannot checkpoint",
				"stop the program from using io_uring (torchrun's agent does; launch the job with gpucr run instead)")
		}
		if p.gpu == nil {
			continue
		}
		if len(p.gpu.Devices) > 1 {
			add(CheckMultiGPU, p, fmt.Sprintf("holds CUDA contexts on %d GPUs; if it ever enabled peer access between them "+
				"(PyTorch does on a device-to-device copy), the driver checkpoints it and then cannot restore it "+
				"(measured on driver 580: CUDA_ERROR_INVALID_VALUE, the process lost), and peer access cannot be seen from outside",
				len(p.gpu.Devices)),
				"run one process per GPU, or, if this process copies between its GPUs only through host memory, --skip-check "+CheckMultiGPU)
		}
		if shm := cudaIPCExport(p.files); shm != "" {
			add(CheckCUDAIPC, p, "exports GPU memory through CUDA IPC (it holds the driver's "+shm+"); the driver cannot "+
				"restore memory shared between processes (measured on driver 580)",
				"pass tensors between processes through host memory, or let one process own the GPU memory")
		}
		if nGPU > 1 && usesNCCLTransports(p) {
			add(CheckNCCL, p, "is one of several GPU processes using NCCL with its P2P/SHM transports, whose shared GPU "+
				"memory the CUDA driver cannot restore (measured on driver 580: error 801 on restore)",
				"start the job with "+strings.Join(ncclSafeEnv, " ")+" (gpucr run -- CMD does this)")
		}
	}
	if !skip[CheckOuterPipe] {
		for _, f := range outerPipes(tree, procs) {
			add(CheckOuterPipe, f.p, fmt.Sprintf("shares a pipe (%s) with process %d (%s), outside the tree: CRIU restores the pipe "+
				"without that process, and the restored process dies at its next write to it (SIGPIPE) or reads nothing more",
				f.pipe, f.outside, tree.CommandOf(f.outside)),
				"send the job's output to a file (> job.log 2>&1), or checkpoint a tree that holds both ends; "+
					"--skip-check "+CheckOuterPipe+" if it never uses that pipe again")
		}
	}
	found, carried := heldFileFindings(tree, procs, skip[CarrySemaphores])
	for _, f := range found {
		add(f.Check, f.p, f.Reason, f.Fix)
	}
	if !skip[CheckTCP] {
		for _, p := range procs {
			if conns := tree.TCPConnections(p.PID); len(conns) > 0 {
				add(CheckTCP, p, "holds "+tcpList(conns)+", which CRIU checkpoints only with --tcp-established",
					"checkpoint with --tcp-established (the restore then needs the same addresses, and the peer's end "+
						"of the connection as it was), or close the connection first")
			}
		}
	}
	if !skip[CheckTCPPending] {
		named := map[string]bool{} // a listener a server's forked workers share, at the first
		for _, p := range procs {
			for _, l := range tree.TCPPendingListeners(p.PID) {
				if named[l.Inode] {
					continue
				}
				named[l.Inode] = true
				add(CheckTCPPending, p, fmt.Sprintf("listens on %s with %d connection(s) the kernel has completed and it "+
					"has not accepted yet, which CRIU refuses to checkpoint, with --tcp-established or without "+
					"(\"In-flight connection\")", l.Local, l.RxQueue),
					"let the job accept its pending connections (a server that stopped accepting), "+
						"or retry the checkpoint in a moment")
			}
		}
	}
	// The checks' order, then the tree's: the first finding is the one to fix first (a
	// job under gpucr run fixes its NCCL transports and its launcher's io_uring at once).
	rank := func(f Finding) int { return slices.IndexFunc(rules, func(r Rule) bool { return r.Name == f.Check }) }
	slices.SortStableFunc(out, func(a, b Finding) int { return rank(a) - rank(b) })
	return out, carried
}

// Check returns the first finding of Analyze as an error, or nil, and the semaphores the
// checkpoint carries.
func Check(tree *proctree.Snapshot, gpus []GPUProcess, skip Skips) ([]Semaphore, error) {
	f, carried := Analyze(tree, gpus, skip)
	switch len(f) {
	case 0:
		return carried, nil
	case 1:
		return nil, &f[0]
	}
	return nil, &moreFindings{Finding: &f[0], more: len(f) - 1}
}

// moreFindings is the first of several findings, saying how many more there are.
type moreFindings struct {
	*Finding
	more int
}

func (m *moreFindings) Unwrap() error { return m.Finding }

func (m *moreFindings) Error() string {
	return fmt.Sprintf("%s; and %d more finding(s): gpucr checkpoint --dry-run lists them", m.Finding.Error(), m.more)
}

// outerPipe is a pipe that process p of the tree shares with process outside, which reads
// what p writes, or writes what p reads.
type outerPipe struct {
	p       *proc
	pipe    string
	outside int
}

// outerPipes finds the pipes and FIFOs on the tree's standard descriptors whose other end a
// process outside it holds: a job run as `job | tee log` checkpointed, restored with exit
// 0, and died at its next line of output, its reader gone (hostile test). A pipe the tree
// and an outside process only both read (a script fed to bash on its stdin, its writer
// gone) loses nothing; nor do descriptors beyond the standard ones a process inherited and
// never uses (a launcher's leaked pipe, held by every process of a session) (review).
func outerPipes(tree *proctree.Snapshot, procs []*proc) []outerPipe {
	targets := map[string]proctree.End{}
	ends := map[int][]proctree.End{}
	for _, p := range procs {
		ends[p.PID] = tree.StdioPipes(p.PID)
		for _, e := range ends[p.PID] {
			targets[e.Target] = e
		}
	}
	outside := tree.HoldersOutside(targets)
	var out []outerPipe
	named := map[string]bool{}
	for _, p := range procs {
		for _, e := range ends[p.PID] {
			h := outside[e.Target]
			other := 0
			switch {
			case e.Write && h.Reader != 0:
				other = h.Reader
			case e.Read && h.Writer != 0:
				other = h.Writer
			}
			if other != 0 && !named[e.Target] {
				named[e.Target] = true // at the first process holding it
				out = append(out, outerPipe{p, e.Target, other})
			}
		}
	}
	return out
}

func read(tree *proctree.Snapshot, p proctree.Process) *proc {
	r := &proc{Process: p, maps: tree.Maps(p.PID), env: tree.Environ(p.PID), threads: tree.ThreadNames(p.PID)}
	r.files, _ = tree.Files(p.PID)
	return r
}

// cudaIPCExport returns the CUDA driver's IPC file among files, or "". Measured on driver
// 580 (docs/restorability.md): a process that exports GPU memory through CUDA IPC — legacy
// handles and cuMem shareable handles alike, as torch.multiprocessing does — holds
// /dev/shm/cuda.shm.<uid>.<pid in hex>.<n>; no other process did.
func cudaIPCExport(files []string) string {
	for _, f := range files {
		if strings.HasPrefix(f, "/dev/shm/cuda.shm.") {
			return f
		}
	}
	return ""
}

// usesNCCLTransports reports whether a GPU process maps NCCL without its socket-only
// settings and may have a communicator. Ranks on P2P/SHM look like ranks on sockets from
// outside (measured); what is seen is whether NCCL could be in use. A PyTorch process has
// a communicator only once its NCCL process group runs its watchdog thread, so a PyTorch
// process without one shares nothing through NCCL; for other programs gpucr cannot tell and
// assumes it may.
func usesNCCLTransports(p *proc) bool {
	if !bytes.Contains(p.maps, []byte("/libnccl")) || len(missingEnv(p.env, ncclSafeEnv)) == 0 {
		return false
	}
	if bytes.Contains(p.maps, []byte("/libtorch_cuda")) {
		return slices.ContainsFunc(p.threads, func(t string) bool { return strings.HasPrefix(t, "pt_nccl_") })
	}
	return true
}

// missingEnv returns the settings of want that the NUL-separated environment env lacks.
func missingEnv(env []byte, want []string) []string {
	have := map[string]bool{}
	for _, kv := range bytes.Split(env, []byte{0}) {
		have[string(kv)] = true
	}
	var out []string
	for _, w := range want {
		if !have[w] {
			out = append(out, w)
		}
	}
	return out
}

// heldFinding is a finding on process p, before the check's switch is read.
type heldFinding struct {
	p *proc
	Finding
}

// heldFileFindings finds the files and shared memory the processes hold that CRIU cannot
// dump, or dumps only by path. Each was a checkpoint that failed on a message of CRIU's
// after the analysis said nothing (hostile test, 2026-11-28), or a restore that ran on
// the wrong data:
//   - System V shared memory attached in the host's IPC namespace (a job of ctypes'
//     shmget/shmat): CRIU dumps segments only with an IPC namespace of the tree's own, and
//     fails "Task N with SysVIPC shmem map doesn't live in IPC ns".
//   - A file held under a path it was deleted from while it has another name: sem_open
//     makes a semaphore's file under a temporary name, links it to the semaphore's and
//     unlinks the first, so every Python multiprocessing Lock, Queue or Pool under the spawn
//     and forkserver start methods failed "Can't create link remap ... Use link-remap
//     option": CRIU's link stays in the file system, outside the image, and its first
//     restore removes it. A process tree's checkpoint carries such semaphores (carry).
//   - A POSIX message queue (mq_open): CRIU does not dump the mqueue file system, and
//     failed "Can't lookup mount=N for fd=3 path=/NAME", in or out of an IPC namespace.
//   - With --leave-running, a file mapped shared and writable (multiprocessing's
//     shared_memory in /dev/shm, a numpy memmap r+): CRIU saves its path, not its bytes,
//     and the job running on changed it, so the restored job found its shared counter
//     ahead of its own state and failed, after a restore that said it succeeded.
//
// With carry, the semaphores a process tree's checkpoint carries in its image (semaphores)
// are no finding, and are returned.
func heldFileFindings(tree *proctree.Snapshot, procs []*proc, carry bool) ([]heldFinding, []Semaphore) {
	var out []heldFinding
	add := func(check string, p *proc, reason, fix string) {
		out = append(out, heldFinding{p, Finding{Check: check, Reason: reason, Fix: fix}})
	}
	linked := make([][]proctree.Held, len(procs))
	queues := make([][]proctree.Held, len(procs))
	shared := make([][]proctree.Held, len(procs))
	for i, p := range procs {
		linked[i], queues[i], shared[i] = heldFiles(tree, p.PID)
	}
	var carried []Semaphore
	if carry {
		// A carried semaphore's bytes are in the image, as they were: mapped by its other
		// name too (a spawned child's), it is no shared file of --leave-running's either.
		carried = semaphores(tree, slices.Concat(linked...))
		isCarried := func(h proctree.Held) bool {
			return slices.ContainsFunc(carried, func(s Semaphore) bool { return os.SameFile(s.Info, h.Info) })
		}
		for i := range linked {
			linked[i] = slices.DeleteFunc(linked[i], isCarried)
			shared[i] = slices.DeleteFunc(shared[i], isCarried)
		}
	}
	ownIPC := len(procs) > 0 && !tree.SharesNamespace(procs[0].PID, "ipc")
	for i, p := range procs {
		if seg := sysvSegment(p.maps); seg != "" && !ownIPC {
			add(CheckSysVShm, p, "attaches System V shared memory ("+seg+") in the host's IPC namespace, which CRIU "+
				"checkpoints only in an IPC namespace of the job's own",
				"start the job in an IPC namespace of its own (unshare --ipc CMD); CRIU then saves its segments with it")
		}
		linkedAway, queues, shared := linked[i], queues[i], shared[i]
		if len(linkedAway) > 0 {
			add(CheckLinkedAway, p, fmt.Sprintf("holds %s, deleted from that path while the file has another name, as "+
				"sem_open leaves a POSIX semaphore (Python's multiprocessing does under its spawn and forkserver start "+
				"methods); CRIU checkpoints that only through a link it leaves beside the image, which the first restore "+
				"removes", heldList(linkedAway)),
				"let the program unlink the file's other name first (multiprocessing does so under the fork start method), "+
					"or checkpoint it once the file is closed; a process tree's semaphores in "+ShmDir+" are checkpointed "+
					"where no process outside the tree holds them too")
		}
		if len(queues) > 0 {
			add(CheckMQueue, p, "holds the POSIX message queue "+heldList(queues)+", which CRIU cannot checkpoint",
				"pass the job's messages through a pipe, a socket or a file instead (Python's multiprocessing.Queue is a pipe)")
		}
		if len(shared) > 0 {
			add(CheckSharedFile, p, "maps "+heldList(shared)+" shared and writable: CRIU saves a file's path, not its bytes, "+
				"and the job left running changes it, so a restore would give the job the file as it was later, not at "+
				"the checkpoint",
				"checkpoint without --leave-running (the job stops once saved and runs on when restored), or --skip-check "+
					CheckSharedFile+" if the job no longer writes the file")
		}
	}
	return out, carried
}

// CarrySemaphores, among the skips the engine gives a target whose dump gpucr asks of
// CRIU itself (a process tree), has deleted-but-linked pass the semaphores that the
// checkpoint carries in its image (Semaphores); a container's runtime dumps without them.
const CarrySemaphores = "carry-semaphores"

// ShmDir is where sem_open makes a semaphore's file, and MaxSemaphore the most bytes a
// carried one may hold (glibc's are 32).
const (
	ShmDir       = "/dev/shm"
	MaxSemaphore = 4096
)

// Semaphore is a POSIX semaphore's file that a process of the tree maps under the
// temporary name sem_open made it with, since deleted, while the file has the semaphore's
// name too (Path). CRIU dumps such a file through a link it leaves in ShmDir
// (--link-remap), which its restore consumes; a process tree's checkpoint carries the
// file's bytes in its image and makes the link again before each restore.
type Semaphore struct {
	Path string      // its other name, in ShmDir
	Info os.FileInfo // the file, as the tree holds it
}

// Semaphores returns the semaphores the processes of tree hold that its checkpoint carries,
// or the finding on a file deleted but linked that it cannot carry.
func Semaphores(tree *proctree.Snapshot) ([]Semaphore, error) {
	procs := make([]*proc, 0, len(tree.Processes()))
	for _, p := range tree.Processes() {
		procs = append(procs, &proc{Process: p})
	}
	found, carried := heldFileFindings(tree, procs, true)
	for _, f := range found {
		if f.Check == CheckLinkedAway {
			f.PID, f.Command = f.p.PID, f.p.Command
			return nil, &f.Finding
		}
	}
	return carried, nil
}

// semaphores are the files of linked (held under a path deleted while they have another
// name) that a process tree's checkpoint carries, once each: a file of at most
// MaxSemaphore bytes deleted from ShmDir/sem.*, whose other name is ShmDir/sem.* too, and
// which no process outside the tree holds or maps (its restore would not share the file
// with that process again). Anything else stays refused.
func semaphores(tree *proctree.Snapshot, linked []proctree.Held) []Semaphore {
	var out []Semaphore
	var names []os.FileInfo // ShmDir's semaphores, read once if any file may be one
	for _, h := range linked {
		p := strings.TrimSuffix(h.Path, deleted)
		if filepath.Dir(p) != ShmDir || !strings.HasPrefix(filepath.Base(p), "sem.") || h.Info.Size() > MaxSemaphore ||
			slices.ContainsFunc(out, func(s Semaphore) bool { return os.SameFile(s.Info, h.Info) }) {
			continue
		}
		if names == nil {
			names = shmSemaphores()
		}
		if i := slices.IndexFunc(names, func(n os.FileInfo) bool { return os.SameFile(n, h.Info) }); i >= 0 {
			out = append(out, Semaphore{Path: filepath.Join(ShmDir, names[i].Name()), Info: h.Info})
		}
	}
	for len(out) > 0 {
		infos := make([]os.FileInfo, len(out))
		for i, s := range out {
			infos[i] = s.Info
		}
		i, _ := tree.HolderOutside(ShmDir, infos)
		if i < 0 {
			break
		}
		out = slices.Delete(out, i, i+1)
	}
	return out
}

// shmSemaphores are the regular files named sem.* in ShmDir, as lstat describes them; an
// empty, not nil, list where there are none.
func shmSemaphores() []os.FileInfo {
	out := []os.FileInfo{}
	entries, _ := os.ReadDir(ShmDir)
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "sem.") || !e.Type().IsRegular() {
			continue
		}
		if fi, err := os.Lstat(filepath.Join(ShmDir, e.Name())); err == nil && fi.Mode().IsRegular() {
			out = append(out, fi)
		}
	}
	return out
}

// heldFiles returns the files pid holds under a path they were deleted from while they
// have another name, the POSIX message queues it holds open, and the files it maps shared
// and writable under their own path (one deleted from every name is saved in the image,
// bytes and all).
func heldFiles(tree *proctree.Snapshot, pid int) (linkedAway, queues, shared []proctree.Held) {
	want := func(h proctree.Held) bool { return h.FD >= 0 || strings.HasSuffix(h.Path, deleted) || h.Shared }
	for _, h := range tree.HeldFiles(pid, want) {
		switch {
		case h.FD >= 0 && h.FSType == mqueueMagic:
			queues = append(queues, h)
		case strings.HasSuffix(h.Path, deleted):
			if h.Links() > 0 {
				linkedAway = append(linkedAway, h)
			}
		case h.Shared && !slices.ContainsFunc(shared, func(o proctree.Held) bool { return o.Path == h.Path }):
			shared = append(shared, h)
		}
	}
	return linkedAway, queues, shared
}

// mqueueMagic is the mqueue file system's magic number (statfs), where a descriptor of
// mq_open points.
const mqueueMagic = 0x19800202

// heldList names the first of files, its descriptor if it is held through one, and how
// many more there are: "/dev/shm/sem.x and 2 more", "/data/x (fd 3)".
func heldList(files []proctree.Held) string {
	h := files[0]
	s := strings.TrimSuffix(h.Path, deleted)
	if h.FD >= 0 {
		s += " (fd " + strconv.Itoa(h.FD) + ")"
	}
	return andMore(s, len(files)-1)
}

// andMore is first, the first of a list, and how many more there are, if any.
func andMore(first string, more int) string {
	if more > 0 {
		first += fmt.Sprintf(" and %d more", more)
	}
	return first
}

// deleted is what procfs puts after the path of a file deleted from it.
const deleted = " (deleted)"

// sysvSegment returns the path of the first System V shared memory segment maps (a
// /proc/PID/maps) attaches, "/SYSV" and its key in hex, or "".
func sysvSegment(maps []byte) string {
	for line := range strings.Lines(string(maps)) {
		if m, ok := proctree.ParseMapping(strings.TrimSuffix(line, "\n")); ok && strings.HasPrefix(m.Path, "/SYSV") {
			return strings.TrimSuffix(m.Path, deleted)
		}
	}
	return ""
}

// tcpList names the first of conns and how many more there are: a client connected to a
// server checkpointed without --tcp-established failed in CRIU, after the GPU was locked
// and checkpointed, and --dry-run had found nothing (hostile test).
// A connection connecting or closing is named with its state (CLOSE_WAIT: its peer closed).
func tcpList(conns []proctree.TCPEntry) string {
	c := conns[0]
	what := "an established TCP connection"
	if c.State != proctree.TCPEstablished {
		what = "a TCP connection in " + c.StateName()
	}
	return andMore(what+" ("+c.Local.String()+" to "+c.Remote.String()+")", len(conns)-1)
}
