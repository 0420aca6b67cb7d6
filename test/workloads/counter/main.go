// Command counter is gpucr's CPU test workload: it counts, fills memory with a pattern that
// it can re-check, and optionally forks a child that it feeds through a pipe, so tests and
// the demo can see a restored tree carry on from where it was.
//
// Every tick it writes its count to DIR/count (and the child to DIR/child); on SIGUSR1 it
// re-checks its memory and writes "ok N" or "bad N" to DIR/verify. Started as a rank (RANK
// set, as by gpucr run) it writes DIR/count.RANK instead. Each file holds one line padded
// with spaces to a fixed width, and is opened and closed each time (see write). With -log it
// also appends each count to a file it holds open for appending, as a job's log is; with -out
// it writes each to a file it holds open from its start, as a job's output sent with >.
package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	dir := flag.String("dir", ".", "where to write count, child and verify files")
	mib := flag.Int("mib", 0, "MiB of memory to fill with a checkable pattern")
	child := flag.Bool("child", false, "fork a child fed through a pipe")
	isChild := flag.Bool("as-child", false, "internal: run as the child")
	tick := flag.Duration("tick", 100*time.Millisecond, "counting interval")
	tcp := flag.Bool("tcp", false, "send each count through a loopback TCP connection to itself")
	random := flag.Int("random-mib", 0, "MiB of memory to fill with seeded random 64-bit values, as the GPU holder's (test/gpu/holder.py): incompressible, checked too")
	shm := flag.Int("shm", 0, "MiB of shared anonymous memory and of memfd memory to fill with the pattern too")
	gpuState := flag.String("gpu-state", "", "a fake GPU's state directory: count only while DIR/PID says running (0), as a process blocked on its GPU would")
	logPath := flag.String("log", "", "a file to append each count to, held open for appending (as >> opens it)")
	outPath := flag.String("out", "", "a file to write each count to, held open write-only from its start (as > opens it)")
	flag.Parse()
	if *isChild {
		runChild(*dir)
		return
	}

	mem := fill(*mib << 20)
	rnd := randomFill(*random << 20)
	shared := sharedMemory(*shm << 20)
	var pipe *os.File
	if *child {
		r, w, err := os.Pipe()
		must(err)
		cmd := exec.Command("/proc/self/exe", "-as-child", "-dir", *dir)
		cmd.Stdin = r
		must(cmd.Start())
		r.Close()
		pipe = w
	}
	var outputs []*os.File
	open := func(path string, flags int) {
		if path != "" {
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|flags, 0o644)
			must(err)
			outputs = append(outputs, f)
		}
	}
	open(*logPath, os.O_APPEND)
	open(*outPath, os.O_TRUNC)
	var conn *tcpLoop
	if *tcp {
		conn = newTCPLoop()
	}
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	t := time.NewTicker(*tick)
	for n := 1; ; n++ {
		select {
		case <-usr1:
			verdict := "ok"
			if !check(mem) || !checkRandom(rnd) {
				verdict = "bad"
			}
			for _, b := range shared {
				if !check(b) {
					verdict = "bad"
				}
			}
			write(filepath.Join(*dir, "verify"), fmt.Sprintf("%s %d\n", verdict, n))
		case <-t.C:
		}
		if *gpuState != "" && !gpuRunning(*gpuState) {
			n--
			continue
		}
		write(filepath.Join(*dir, countFile()), strconv.Itoa(n)+"\n")
		for _, f := range outputs {
			_, err := fmt.Fprintf(f, "%d\n", n)
			must(err)
		}
		if conn != nil {
			conn.roundTrip(n)
		}
		if pipe != nil {
			_, err := fmt.Fprintf(pipe, "%d\n", n)
			must(err)
		}
	}
}

// tcpLoop is an established loopback TCP connection with both ends in this process.
type tcpLoop struct {
	client, server net.Conn
	r              *bufio.Reader
}

func newTCPLoop() *tcpLoop {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(err)
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	must(err)
	s, err := l.Accept()
	must(err)
	return &tcpLoop{client: c, server: s, r: bufio.NewReader(s)}
}

// roundTrip sends n through the connection and checks it arrives.
func (t *tcpLoop) roundTrip(n int) {
	_, err := fmt.Fprintf(t.client, "%d\n", n)
	must(err)
	line, err := t.r.ReadString('\n')
	must(err)
	if line != fmt.Sprintf("%d\n", n) {
		must(fmt.Errorf("tcp: sent %d, got %q", n, line))
	}
}

// gpuRunning reads this process's state in a fake GPU's state directory: 0, or no file, is
// running; 1 locked, 2 checkpointed.
func gpuRunning(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, strconv.Itoa(os.Getpid())))
	return err != nil || strings.TrimSpace(string(b)) == "0"
}

func countFile() string {
	if r := os.Getenv("RANK"); r != "" {
		return "count." + r
	}
	return "count"
}

// runChild writes every number that arrives on stdin to DIR/child.
func runChild(dir string) {
	s := bufio.NewScanner(os.Stdin)
	for s.Scan() {
		write(filepath.Join(dir, "child"), s.Text()+"\n")
	}
}

// pattern is a cheap position-dependent value, so a page moved or zeroed is caught.
func pattern(i int) byte { return byte(i*131 + i>>9) }

func fill(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = pattern(i)
	}
	return b
}

// randomBlocks calls f with each block of n seeded random bytes in turn: 64-bit values in
// [-2^62, 2^62), as holder.py draws them on the GPU.
func randomBlocks(n int, f func(off int, block []byte)) {
	r := rand.New(rand.NewPCG(1234, 0))
	block := make([]byte, 1<<20)
	for off := 0; off < n; off += len(block) {
		b := block[:min(len(block), n-off)]
		for i := 0; i+8 <= len(b); i += 8 {
			binary.LittleEndian.PutUint64(b[i:], uint64(int64(r.Uint64()>>1)-1<<62))
		}
		f(off, b)
	}
}

func randomFill(n int) []byte {
	mem := make([]byte, n)
	randomBlocks(n, func(off int, b []byte) { copy(mem[off:], b) })
	return mem
}

func checkRandom(mem []byte) bool {
	ok := true
	randomBlocks(len(mem), func(off int, b []byte) { ok = ok && bytes.Equal(mem[off:off+len(b)], b) })
	return ok
}

// sharedMemory maps n bytes of shared anonymous memory and n bytes of a memfd, both
// filled with the pattern: CRIU saves these as shared memory, not as the process's own pages.
func sharedMemory(n int) [][]byte {
	if n == 0 {
		return nil
	}
	anon, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_ANON)
	must(err)
	fd, err := unix.MemfdCreate("counter", 0)
	must(err)
	must(unix.Ftruncate(fd, int64(n)))
	memfd, err := syscall.Mmap(fd, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	must(err)
	for _, b := range [][]byte{anon, memfd} {
		for i := range b {
			b[i] = pattern(i)
		}
	}
	return [][]byte{anon, memfd}
}

func check(b []byte) bool {
	for i := range b {
		if b[i] != pattern(i) {
			return false
		}
	}
	return true
}

// write replaces path's content with s, padded to a fixed width. It writes path.tmp in place
// and exchanges the two names, so that both always exist at the same size: a checkpoint that
// catches path.tmp open finds it again at restore, as CRIU requires, with the size it had.
func write(path, s string) {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE, 0o644)
	must(err)
	_, err = f.WriteAt([]byte(fmt.Sprintf("%-31s\n", strings.TrimSpace(s))), 0)
	must(err)
	must(f.Close())
	if unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, path, unix.RENAME_EXCHANGE) != nil {
		must(os.Rename(tmp, path)) // path is not there yet, or was removed
	}
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "counter:", err)
		os.Exit(1)
	}
}
