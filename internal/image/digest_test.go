package image_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/gpucr/gpucr/internal/beneath"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/image/imagetest"
	"github.com/gpucr/gpucr/internal/signing"
)

// pagesPath is the large file of the images these tests make: three hashing pieces.
const pagesPath = "criu/pages-1.img"

// commitTestImage commits a small image into a new directory, signed by key when not nil.
func commitTestImage(t *testing.T, key ed25519.PrivateKey) string {
	t.Helper()
	pages := make([]byte, 2*image.HashChunkSize+4096)
	rand.Read(pages)
	m := &image.Manifest{GpucrVersion: "test", RootPID: 1, Processes: []image.Process{{PID: 1}}}
	return imagetest.Commit(t, map[string][]byte{pagesPath: pages, "criu/core-1.img": []byte("core")}, m, key)
}

func newKey(t *testing.T) (ed25519.PrivateKey, signing.Keys) {
	t.Helper()
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key, signing.Keys{signing.ID(pub): pub}
}

// forge rewrites the middle piece of the image's page file so that its xxh64, and so the
// file's, is unchanged: what a second hostile test did to a signed image as nobody.
func forge(t *testing.T, dir string) {
	t.Helper()
	path := filepath.Join(dir, filepath.FromSlash(pagesPath))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	imagetest.ForgeXXH64(b[image.HashChunkSize:2*image.HashChunkSize], 64, 0xcc)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// A signed image's manifest records every file's SHA-256, computed as the format says,
// and a file changed so that its xxh64 still matches is refused by a trusted open; an
// unsigned image, which only finds damage, does not see it.
func TestSignedImageCoversEveryByte(t *testing.T) {
	key, trusted := newKey(t)
	dir := commitTestImage(t, key)
	m, err := image.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !m.Digested() {
		t.Fatalf("signed image's files %+v: want a SHA-256 each", m.Files)
	}
	b, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(pagesPath)))
	if err != nil {
		t.Fatal(err)
	}
	var digests []byte
	for off := 0; off < len(b); off += image.HashChunkSize {
		d := sha256.Sum256(b[off:min(off+image.HashChunkSize, len(b))])
		digests = append(digests, d[:]...)
	}
	want := sha256.Sum256(digests)
	i := slices.IndexFunc(m.Files, func(f image.File) bool { return f.Path == pagesPath })
	if m.Files[i].SHA256 != hex.EncodeToString(want[:]) {
		t.Fatalf("SHA-256 of %s = %s, want that of its pieces' SHA-256s, %x", pagesPath, m.Files[i].SHA256, want)
	}

	forge(t, dir)
	_, _, err = image.OpenTrusted(dir, trusted)
	if !errors.Is(err, image.ErrCorrupt) || !strings.Contains(err.Error(), "SHA-256 mismatch") || !strings.Contains(err.Error(), pagesPath) {
		t.Fatalf("trusted open of a forged signed image = %v, want %s named by a SHA-256 mismatch", err, pagesPath)
	}

	unsigned := commitTestImage(t, nil)
	forge(t, unsigned)
	if _, err := image.Open(unsigned); err != nil {
		t.Fatalf("the forgery must keep every xxh64 for this test to mean anything: %v", err)
	}
}

// A signature of a manifest without SHA-256 digests (an older gpucr's) vouches for no
// file's bytes: a trusted load refuses it and says how to sign it properly.
func TestTrustRefusesSignatureWithoutDigests(t *testing.T) {
	key, trusted := newKey(t)
	dir := commitTestImage(t, nil)
	signOldStyle(t, dir, key)
	_, _, err := image.LoadTrusted(dir, trusted)
	if !errors.Is(err, signing.ErrUntrusted) || !strings.Contains(err.Error(), "no SHA-256") || !strings.Contains(err.Error(), "gpucr sign") {
		t.Fatalf("trusted load of a manifest signed without digests = %v", err)
	}
	if _, err := image.Load(dir); err != nil {
		t.Fatalf("the image itself is whole: %v", err)
	}
}

// signOldStyle signs the manifest's bytes as they are, as gpucr did before SHA-256 digests.
func signOldStyle(t *testing.T, dir string, key ed25519.PrivateKey) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, image.ManifestName))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, image.SigName), signing.Sign(key, b), 0o600); err != nil {
		t.Fatal(err)
	}
}

// gpucr sign gives an image without digests its SHA-256s (the manifest written again, its
// old signatures dropped and named), and keeps other keys' signatures of a manifest that
// has them.
func TestSignAddsDigests(t *testing.T) {
	a, trustA := newKey(t)
	b, trustB := newKey(t)
	dir := commitTestImage(t, nil)
	signOldStyle(t, dir, b)

	got, err := image.Sign(dir, a)
	if err != nil {
		t.Fatal(err)
	}
	idB := signing.ID(b.Public().(ed25519.PublicKey))
	if !slices.Equal(got.Dropped, []string{idB}) {
		t.Fatalf("dropped %v, want B's old signature %s", got.Dropped, idB)
	}
	m, signer, err := image.OpenTrusted(dir, trustA)
	if err != nil || !m.Digested() || signer != got.KeyID {
		t.Fatalf("trusted open after sign: signer %q, digested %v, %v", signer, m != nil && m.Digested(), err)
	}
	if _, _, err := image.OpenTrusted(dir, trustB); !errors.Is(err, signing.ErrUntrusted) {
		t.Fatalf("B's dropped signature still trusted: %v", err)
	}
	seal, err := os.ReadFile(filepath.Join(dir, image.SealName))
	if err != nil || strings.Count(string(seal), "\n") != 1 {
		t.Fatalf("seal %q after sign, want one line (%v)", seal, err)
	}

	got, err = image.Sign(dir, b)
	if err != nil || len(got.Dropped) != 0 {
		t.Fatalf("second key's sign: dropped %v, %v", got.Dropped, err)
	}
	for _, k := range []signing.Keys{trustA, trustB} {
		if _, _, err := image.OpenTrusted(dir, k); err != nil {
			t.Fatalf("both signatures must hold: %v", err)
		}
	}

	forge(t, dir)
	if _, err := image.Sign(dir, a); !errors.Is(err, image.ErrCorrupt) {
		t.Fatalf("sign of a forged image = %v, want it refused as corrupt", err)
	}
	// Sign reads through the directory it holds; its errors still name the image as given.
	empty := t.TempDir()
	if _, err := image.Sign(empty, a); !errors.Is(err, image.ErrNoManifest) || !strings.Contains(err.Error(), empty) ||
		strings.Contains(err.Error(), "/proc/") {
		t.Fatalf("sign of a directory that is no image = %v, want ErrNoManifest naming %s", err, empty)
	}
}

// Sign writes a manifest with digests in steps; the image loads after each of them, and
// a sign interrupted anywhere can be run again.
func TestSignInterruptedLeavesAnImage(t *testing.T) {
	key, trusted := newKey(t)
	dir := commitTestImage(t, nil)
	done := filepath.Join(t.TempDir(), "done")
	if err := os.CopyFS(done, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	if _, err := image.Sign(done, key); err != nil {
		t.Fatal(err)
	}
	read := func(d, name string) []byte {
		b, err := os.ReadFile(filepath.Join(d, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	write := func(name string, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	oldSeal, newSeal, newManifest := read(dir, image.SealName), read(done, image.SealName), read(done, image.ManifestName)

	write(image.SealName+".new", []byte("half"))
	write(image.SealName, append(oldSeal, newSeal...)) // step 1: the seal lists both
	if _, err := image.Open(dir); err != nil {
		t.Fatalf("old manifest with both seals: %v", err)
	}
	write(image.ManifestName, newManifest) // step 3: the new manifest
	if _, err := image.Open(dir); err != nil {
		t.Fatalf("new manifest with both seals: %v", err)
	}
	write(image.SealName, append(append(oldSeal, newSeal...), oldSeal...))
	if _, err := image.Load(dir); !errors.Is(err, image.ErrCorrupt) {
		t.Fatalf("a seal of three lines = %v, want corrupt", err)
	}
	write(image.SealName, append(oldSeal, newSeal...))
	if _, err := image.Sign(dir, key); err != nil {
		t.Fatalf("sign again after an interrupted one: %v", err)
	}
	if _, _, err := image.OpenTrusted(dir, trusted); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, image.SealName+".new")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the interrupted sign's leftover is still there: %v", err)
	}
}

// gpucr sign, as root, of an image others can write reads and writes its files by name
// only: a manifest.sig that is a symlink to a root-only file is refused, not read (its
// lines would be kept in the new signature file), and nothing outside the image is
// written.
func TestSignFollowsNoSymlink(t *testing.T) {
	key, _ := newKey(t)
	dir := commitTestImage(t, nil)
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("ed25519 0123456789abcdef c2VjcmV0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(dir, image.SigName)); err != nil {
		t.Fatal(err)
	}
	if _, err := image.Sign(dir, key); err == nil || !strings.Contains(err.Error(), image.SigName) {
		t.Fatalf("sign with %s a symlink = %v, want it refused", image.SigName, err)
	}
	if b, _ := os.ReadFile(secret); !strings.HasPrefix(string(b), "ed25519 0123456789abcdef") || len(b) != 34 {
		t.Fatalf("the symlink's target changed: %q", b)
	}
	// A directory given through a symlink is refused, and named: whoever can write the
	// link could point it at an image of someone else's.
	if err := os.Remove(filepath.Join(dir, image.SigName)); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	if _, err := image.Sign(link, key); !errors.Is(err, beneath.ErrSymlinkInPath) || !strings.Contains(err.Error(), dir) {
		t.Fatalf("sign through a symlinked directory = %v, want it refused naming %s", err, dir)
	}
	if _, err := os.Lstat(filepath.Join(dir, image.SigName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the symlink's target was signed: %v", err)
	}
	// A FIFO in the image is refused, not waited on.
	fifo := commitTestImage(t, nil)
	if err := os.Remove(filepath.Join(fifo, image.ManifestName)); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(fifo, image.ManifestName), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := image.Sign(fifo, key); !errors.Is(err, beneath.ErrNotRegular) {
		t.Fatalf("sign of an image whose manifest is a FIFO = %v, want it refused", err)
	}
	if _, err := image.Load(fifo); !errors.Is(err, beneath.ErrNotRegular) {
		t.Fatalf("load of an image whose manifest is a FIFO = %v, want it refused", err)
	}
}

// A file's pieces recorded in any order check as the file, only once all are in; a piece
// of other bytes, or a read that is not one whole piece, is not taken for one.
func TestFileReads(t *testing.T) {
	for _, strong := range []bool{false, true} {
		data := make([]byte, 2*image.HashChunkSize+5)
		for i := range data {
			data[i] = byte(i*7 + i>>20) // no two pieces alike
		}
		var pieces []image.Piece
		for off := 0; off < len(data); off += image.HashChunkSize {
			pieces = append(pieces, image.SumPiece(data[off:min(off+image.HashChunkSize, len(data))], strong))
		}
		f := image.FileOf("mem/x", int64(len(data)), pieces, strong)
		r := image.NewFileReads(f)
		for _, c := range []struct{ off, n int64 }{{1, image.HashChunkSize}, {0, image.HashChunkSize - 1}, {2 * image.HashChunkSize, image.HashChunkSize}, {3 * image.HashChunkSize, 0}, {-image.HashChunkSize, image.HashChunkSize}} {
			if k, ok := r.Piece(c.off, c.n); ok {
				t.Errorf("a read of %d bytes at %d taken for piece %d", c.n, c.off, k)
			}
		}
		for _, k := range []int{2, 0} {
			i, ok := r.Piece(int64(k)*image.HashChunkSize, min(image.HashChunkSize, int64(len(data)-k*image.HashChunkSize)))
			if !ok || i != k {
				t.Fatalf("piece %d: %d, %v", k, i, ok)
			}
			r.Record(i, pieces[i])
		}
		if r.Whole() || !errors.Is(r.Check(), image.ErrCorrupt) {
			t.Fatalf("strong %v: a file read in part checks as %v", strong, r.Check())
		}
		r.Record(1, pieces[0])
		if !r.Whole() || !errors.Is(r.Check(), image.ErrCorrupt) {
			t.Fatalf("strong %v: a piece of other bytes checks as %v", strong, r.Check())
		}
		r.Record(1, pieces[1])
		if err := r.Check(); err != nil {
			t.Fatalf("strong %v: the file's own pieces: %v", strong, err)
		}
	}
}
