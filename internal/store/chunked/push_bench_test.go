package chunked_test

import (
	"bytes"
	"context"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/store/chunked"
	"github.com/gpucr/gpucr/internal/store/storetest"
)

// BenchmarkPushMinIO is a push of a 512 MiB image of holder.py's memory into a fresh bucket
// of MinIO on loopback: what a checkpoint streamed to S3 pays the service and the transport
// (its CPU time is this process's only; MinIO's is apart).
//
//	TMPDIR=/dev/shm go test -run '^$' -bench PushMinIO -benchtime 3x ./internal/store/chunked
func BenchmarkPushMinIO(b *testing.B) {
	const size = 512 << 20
	region, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = unix.Munmap(region) }()
	dir, _ := holderImage(b, uintptr(unsafe.Pointer(&region[0])), size)
	srv := storetest.Start(b)
	b.SetBytes(size)
	cpu := cpuTime(b)
	var stats *chunked.Stats
	for b.Loop() {
		if _, stats, err = chunked.Push(context.Background(), srv.Store(b), "ckpt", dir, chunked.Options{}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cpuTime(b)-cpu)/float64(b.N)/1e6, "cpu-ms/op")
	b.ReportMetric(float64(stats.WireBytes)/float64(stats.TransferredBytes), "wire/byte")
}

// BenchmarkStreamMinIO streams 512 MiB of holder.py's memory (random, a zero chunk in
// sixteen) into a fresh bucket of MinIO on loopback, as a checkpoint --to receives the
// memory it saves: in 8 MiB reads, each chunk hashed, checked for compression and uploaded.
//
//	TMPDIR=/dev/shm go test -run '^$' -bench StreamMinIO -benchtime 3x ./internal/store/chunked
func BenchmarkStreamMinIO(b *testing.B) {
	const size = 512 << 20
	data := holderMemory(size)
	srv := storetest.Start(b)
	ctx := context.Background()
	b.SetBytes(size)
	cpu := cpuTime(b)
	for range b.N {
		s, err := chunked.NewStream(ctx, srv.Store(b), "ckpt", chunked.Options{})
		if err != nil {
			b.Fatal(err)
		}
		f, err := s.Create("pages-1.img")
		if err != nil {
			b.Fatal(err)
		}
		r := bytes.NewReader(data)
		for at := 0; at < size; at += image.HashChunkSize {
			if err := f.Receive(uint64(at), image.HashChunkSize, r); err != nil {
				b.Fatal(err)
			}
		}
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
		if _, err := s.Files(); err != nil {
			b.Fatal(err)
		}
		s.Abort()
	}
	b.ReportMetric(float64(cpuTime(b)-cpu)/float64(b.N)/1e6, "cpu-ms/op")
}
