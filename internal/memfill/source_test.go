package memfill

import (
	"context"
	"crypto/sha256"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/image/imagetest"
)

// writeMemFile writes size random bytes as an image file at rel under dir and returns its
// manifest entry, checksummed as the image checksums files.
func writeMemFile(t *testing.T, dir, rel string, size int64, signed bool) (image.File, []byte) {
	t.Helper()
	data := make([]byte, size)
	r := rand.New(rand.NewPCG(1, uint64(size)))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	var pieces []image.Piece
	for off := int64(0); off < size; off += image.HashChunkSize {
		piece := data[off:min(off+image.HashChunkSize, size)]
		pieces = append(pieces, image.Piece{XXH64: xxhash.Sum64(piece), SHA256: sha256.Sum256(piece)})
	}
	path := filepath.Join(dir, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return image.FileOf(rel, size, pieces, signed), data
}

// readPieces reads f through src as the fill does: aligned pieces, the last one short.
func readPieces(t *testing.T, src Source, f image.File, skip int64) {
	t.Helper()
	buf := make([]byte, image.HashChunkSize)
	for off := int64(0); off < f.Size; off += image.HashChunkSize {
		if off == skip {
			continue
		}
		p := buf[:min(image.HashChunkSize, f.Size-off)]
		next := 0
		err := src.ReadPiece(context.Background(), f.Path, off, p, func(at int, part []byte) error {
			if at != next || len(part) == 0 || len(part) > step || &part[0] != &p[at] {
				t.Fatalf("piece at %d: part at %d of %d bytes after %d: not the next step of the buffer", off, at, len(part), next)
			}
			next += len(part)
			return nil
		})
		if err != nil || next != len(p) {
			t.Fatalf("piece at %d: %d of %d bytes handed on, %v", off, next, len(p), err)
		}
	}
}

// The fill verifies the files it reads whole as it reads them: right ones pass, a file
// changed after the manifest is named, and one the fill skipped a piece of is read again
// in full, so a change there is caught too.
func TestCheckedDirVerifiesWhatTheFillReads(t *testing.T) {
	dir := t.TempDir()
	size := int64(2*image.HashChunkSize + 12345)
	f, data := writeMemFile(t, dir, "mem/1-7f0000000000.img", size, false)

	src := CheckedDir(dir, []image.File{f})
	readPieces(t, src, f, -1)
	if err := src.Verify(); err != nil {
		t.Fatalf("Verify of an intact file read whole: %v", err)
	}

	data[size-1] ^= 1 // the last, short piece
	if err := os.WriteFile(filepath.Join(dir, "mem", "1-7f0000000000.img"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	refusedEitherWay(t, dir, f, "checksum mismatch")
}

// refusedEitherWay checks that f, changed in its middle piece or its last, is named
// corrupt by Verify for the reason want, whether the fill read every piece or skipped the
// middle one (which Verify then reads again).
func refusedEitherWay(t *testing.T, dir string, f image.File, want string) {
	t.Helper()
	for name, skip := range map[string]int64{"read whole": -1, "a piece not read": image.HashChunkSize} {
		t.Run(name, func(t *testing.T) {
			src := CheckedDir(dir, []image.File{f})
			readPieces(t, src, f, skip)
			err := src.Verify()
			var ce *image.CorruptError
			if !errors.As(err, &ce) || ce.Path != f.Path || !strings.Contains(err.Error(), want) {
				t.Fatalf("Verify of a changed file = %v, want it named corrupt: %q", err, want)
			}
		})
	}
}

// A signed image's memory file is checked by its SHA-256 as the fill reads it: bytes
// changed so that every xxh64 still matches (as anyone who can write the file can) are
// refused, whether the fill read the changed piece or Verify reads it again.
func TestCheckedDirRefusesForgedSignedFile(t *testing.T) {
	dir := t.TempDir()
	rel := "mem/1-7f0000000000.img"
	size := int64(2*image.HashChunkSize + 12345)
	f, data := writeMemFile(t, dir, rel, size, true)
	imagetest.ForgeXXH64(data[image.HashChunkSize:2*image.HashChunkSize], 100, 0x90)
	if err := os.WriteFile(filepath.Join(dir, filepath.FromSlash(rel)), data, 0o600); err != nil {
		t.Fatal(err)
	}
	refusedEitherWay(t, dir, f, "SHA-256 mismatch")
	unsigned := f
	unsigned.SHA256 = ""
	src := CheckedDir(dir, []image.File{unsigned})
	readPieces(t, src, unsigned, -1)
	if err := src.Verify(); err != nil {
		t.Fatalf("the forgery must keep the xxh64 for this test to mean anything: %v", err)
	}
}
