package image

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// A file's checksum is the same whether Commit reads it or a Summer sees it pass in pieces.
func TestSummerMatchesFileChecksum(t *testing.T) {
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(1, 2))
	for _, size := range []int{0, 1, ChunkSize - 1, ChunkSize, ChunkSize + 1, 2*ChunkSize + 4096} {
		data := make([]byte, size)
		for i := range data {
			data[i] = byte(r.Uint32())
		}
		if err := os.WriteFile(filepath.Join(dir, "f"), data, 0o600); err != nil {
			t.Fatal(err)
		}
		want, err := sumFiles(dir, []string{"f"}, false)
		if err != nil {
			t.Fatal(err)
		}
		s := NewSummer()
		for rest := data; len(rest) > 0; {
			n := min(len(rest), 1+r.IntN(3<<20))
			s.Write(rest[:n])
			rest = rest[n:]
		}
		if got := s.File("f"); got != want[0] {
			t.Errorf("size %d: summer %+v, file %+v", size, got, want[0])
		}
	}
}
