package image

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// A file's checksums are the same whether Commit reads it or a Summer sees it pass in pieces.
func TestSummerMatchesFileChecksum(t *testing.T) {
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(1, 2))
	for _, size := range []int{0, 1, HashChunkSize - 1, HashChunkSize, HashChunkSize + 1, 2*HashChunkSize + 4096} {
		data := make([]byte, size)
		for i := range data {
			data[i] = byte(r.Uint32())
		}
		if err := os.WriteFile(filepath.Join(dir, "f"), data, 0o600); err != nil {
			t.Fatal(err)
		}
		for _, strong := range []bool{false, true} {
			want, err := sumFiles(context.Background(), dir, []string{"f"}, false, func(int) bool { return strong })
			if err != nil {
				t.Fatal(err)
			}
			s := NewSummer(strong)
			for rest := data; len(rest) > 0; {
				n := min(len(rest), 1+r.IntN(3<<20))
				s.Write(rest[:n])
				rest = rest[n:]
			}
			if got := s.File("f"); got != want[0] || got.Strong() != strong {
				t.Errorf("size %d, SHA-256 %v: summer %+v, file %+v", size, strong, got, want[0])
			}
		}
	}
}

// Hashing stops when its context ends: a cancelled checksum reads no more and says why.
func TestSumFilesStopsWhenCancelled(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), make([]byte, 4*HashChunkSize), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := sumFiles(ctx, dir, []string{"f"}, true, func(int) bool { return true }); !errors.Is(err, context.Canceled) {
		t.Fatalf("sumFiles after cancel = %v, want context.Canceled", err)
	}
}

// A sparse file's holes are hashed as the zeros they read as, without being read: its
// checksums are those of the same bytes written out (a Summer's), whole holes, a hole that
// ends mid-piece and a short last piece included.
func TestSumFilesHashesHolesAsZeros(t *testing.T) {
	dir := t.TempDir()
	const size = 4*HashChunkSize + 4096
	data := make([]byte, size)
	r := rand.New(rand.NewPCG(3, 4))
	for _, at := range []int{0, 2*HashChunkSize + 100, 4 * HashChunkSize} { // data in pieces 0, 2 and 4
		for i := at; i < min(at+4096, size); i++ {
			data[i] = byte(r.Uint32() | 1)
		}
	}
	f, err := os.Create(filepath.Join(dir, "f"))
	if err != nil {
		t.Fatal(err)
	}
	for _, at := range []int{0, 2*HashChunkSize + 100, 4 * HashChunkSize} {
		if _, err := f.WriteAt(data[at:min(at+4096, size)], int64(at)); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if !InHole(mustOpen(t, filepath.Join(dir, "f")), HashChunkSize, HashChunkSize) {
		t.Skip("this file system keeps no holes")
	}
	for _, strong := range []bool{false, true} {
		got, err := sumFiles(context.Background(), dir, []string{"f"}, false, func(int) bool { return strong })
		if err != nil {
			t.Fatal(err)
		}
		s := NewSummer(strong)
		s.Write(data)
		if want := s.File("f"); got[0] != want {
			t.Errorf("SHA-256 %v: sparse file %+v, its bytes %+v", strong, got[0], want)
		}
	}
}

func mustOpen(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}
