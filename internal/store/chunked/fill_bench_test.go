package chunked_test

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/memfill"
	"github.com/gpucr/gpucr/internal/store"
	"github.com/gpucr/gpucr/internal/store/chunked"
)

// BenchmarkFill is a restore's memory fill (memfill.Plan.Fill) of 256 MiB into fresh
// anonymous memory of this process, as into a restored one, from a local image and from a
// store: the store's costs (fetch, zstd, the check of every chunk) against the local read. The
// memory is test/gpu/holder.py's, seeded random 64-bit values, with one chunk in 16 zeros.
//
//	go test -run '^$' -bench Fill -count 5 ./internal/store/chunked
func BenchmarkFill(b *testing.B) {
	const size = 256 << 20
	ctx := context.Background()
	region, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = unix.Munmap(region) }()
	addr := uintptr(unsafe.Pointer(&region[0]))
	dir, m := holderImage(b, addr, size)
	st := store.NewDir(b.TempDir())
	if _, _, err := chunked.Push(ctx, st, "ckpt", dir, chunked.Options{}); err != nil {
		b.Fatal(err)
	}
	staged, err := chunked.Stage(ctx, st, "ckpt", b.TempDir(), chunked.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer staged.Close()
	for _, c := range []struct {
		name string
		src  memfill.Source
	}{{"local", memfill.Dir(dir)}, {"store", staged.Memory}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(size)
			cpu := cpuTime(b)
			for b.Loop() {
				// The restored process's memory is fresh: not yet faulted in.
				if err := unix.Madvise(region, unix.MADV_DONTNEED); err != nil {
					b.Fatal(err)
				}
				plan, err := memfill.Prepare(dir, c.src, b.TempDir(), m, nil)
				if err != nil {
					b.Fatal(err)
				}
				if err := plan.Fill(ctx); err != nil {
					b.Fatal(err)
				}
			}
			// On a shared machine the CPU time a fill takes varies less than its wall time.
			b.ReportMetric(float64(cpuTime(b)-cpu)/float64(b.N)/1e6, "cpu-ms/op")
		})
	}
}

// holderImage commits an image whose memory gpucr saved is size bytes of this process at
// addr, holder.py's data, and returns it with its manifest.
func holderImage(b *testing.B, addr uintptr, size int) (string, *image.Manifest) {
	dir := filepath.Join(b.TempDir(), "img")
	s, err := image.Begin(dir)
	if err != nil {
		b.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(s.Dir(), criuimg.MemDir), 0o700); err != nil {
		b.Fatal(err)
	}
	data := holderMemory(size)
	name := criuimg.MemDir + "/" + criuimg.MemName(os.Getpid(), uint64(addr))
	if err := os.WriteFile(filepath.Join(s.Dir(), name), data, 0o600); err != nil {
		b.Fatal(err)
	}
	m := &image.Manifest{GpucrVersion: "bench", Created: time.Now().UTC(), RootPID: os.Getpid(), MemoryBytes: uint64(size),
		Processes: []image.Process{{PID: os.Getpid(), PPID: 1, Command: "bench", Threads: 1}}}
	if err := s.Commit(m); err != nil {
		b.Fatal(err)
	}
	m, err = image.Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	return dir, m
}

// holderMemory is size bytes as holder.py holds them: seeded random int64, with every
// sixteenth chunk zero.
func holderMemory(size int) []byte {
	data := make([]byte, size)
	r := rand.New(rand.NewPCG(1234, 0))
	for i := 0; i < size; i += 8 {
		if i/chunked.ChunkSize%16 != 15 {
			binary.LittleEndian.PutUint64(data[i:], uint64(int64(r.Uint64()>>1)-1<<62))
		}
	}
	return data
}

// cpuTime is the CPU time this process has used, user and system.
func cpuTime(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
