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
