package memfill

import (
	"bytes"
	"context"
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// byteSource serves data and has nothing to verify.
type byteSource []byte

func (s byteSource) ReadPiece(_ context.Context, _ string, off int64, p []byte, use func(int, []byte) error) error {
	copy(p, s[off:])
	return use(0, p)
}
func (byteSource) Verify() error { return nil }

// resident reports, for each zeroBlock of mem, whether any of its pages is in memory.
func resident(t *testing.T, mem []byte) []bool {
	t.Helper()
	vec := make([]byte, len(mem)/os.Getpagesize())
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	out := make([]bool, len(mem)/zeroBlock)
	for i, v := range vec {
		out[i*os.Getpagesize()/zeroBlock] = out[i*os.Getpagesize()/zeroBlock] || v&1 != 0
	}
	return out
}

// The fill leaves out the zeros it would write into private anonymous pages the process
// never touched (they read as zeros), and writes every other byte: zeros into pages the
// process did write, and zeros into memory whose untouched pages are not zeros (a private
// mapping of a file).
func TestFillWritesNoZerosIntoUntouchedMemory(t *testing.T) {
	const size = 2 << 20 // four zero blocks of 64 KiB at 256 KiB, two at 1 MiB, the rest data
	data := bytes.Repeat([]byte{7}, size)
	clear(data[256<<10 : 512<<10])
	clear(data[1<<20 : 1<<20+2*zeroBlock])
	fill := func(t *testing.T, mem []byte) *Plan {
		t.Helper()
		p := &Plan{runs: []run{{pid: os.Getpid(), addr: uint64(uintptr(unsafe.Pointer(&mem[0]))), size: size, src: byteSource(data), file: "mem/x.img"}}}
		if err := p.Fill(context.Background()); err != nil {
			t.Fatal(err)
		}
		return p
	}

	mem := mapAnon(t, size, unix.PROT_READ|unix.PROT_WRITE)
	mem[1<<20] = 9 // touched: its zeros must be written
	p := fill(t, mem)
	in := resident(t, mem)
	for i, want := range []bool{true, true, true, true, false, false, false, false, true, true, true, true, true, true, true, true,
		true, false, true, true, true, true, true, true, true, true, true, true, true, true, true, true} {
		if in[i] != want {
			t.Errorf("block %d at %d KiB: in memory %v, want %v", i, i*zeroBlock>>10, in[i], want)
		}
	}
	if !bytes.Equal(mem, data) {
		t.Error("the filled memory is not the source's")
	}
	if p.skipped.Load() != 5*zeroBlock {
		t.Errorf("skipped %d bytes of zeros, want %d", p.skipped.Load(), 5*zeroBlock)
	}

	// Untouched pages of a private file mapping read the file: the zeros go in.
	fd, err := unix.MemfdCreate("fill", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, bytes.Repeat([]byte{1}, size)); err != nil {
		t.Fatal(err)
	}
	file, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unix.Munmap(file) }()
	if p := fill(t, file); !bytes.Equal(file, data) || p.skipped.Load() != 0 {
		t.Errorf("a private file mapping: equal %v, skipped %d", bytes.Equal(file, data), p.skipped.Load())
	}
}
