package image

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// Page files written through CreatePages, in runs of any size, commit with checksums that
// Open recomputes from the files and accepts; the files hold exactly what was received.
func TestPagesFilesCommitVerified(t *testing.T) {
	final := filepath.Join(t.TempDir(), "img")
	s, err := Begin(final)
	if err != nil {
		t.Fatal(err)
	}
	writeStaged(t, s, stagedFiles)
	r := rand.New(rand.NewPCG(3, 4))
	want := map[string][]byte{}
	for i, size := range []int{0, 4096, HashChunkSize, 3*HashChunkSize + 5*4096} {
		name := "pages-6553" + string(rune('1'+i)) + ".img"
		p, err := s.CreatePages(name)
		if err != nil {
			t.Fatal(err)
		}
		data := make([]byte, size)
		for j := range data {
			data[j] = byte(r.Uint32())
		}
		for rest := data; len(rest) > 0; {
			n := min(len(rest), 4096*(1+r.IntN(700)))
			if err := p.Receive(0, n, bytes.NewReader(rest[:n])); err != nil {
				t.Fatal(err)
			}
			rest = rest[n:]
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		want[name] = data
	}
	if err := s.Commit(testManifest()); err != nil {
		t.Fatal(err)
	}
	m, err := Open(final)
	if err != nil {
		t.Fatalf("open an image with page files written as received: %v", err)
	}
	listed := 0
	for _, f := range m.Files {
		if _, ok := want[filepath.Base(f.Path)]; ok {
			listed++
		}
	}
	if listed != len(want) {
		t.Errorf("manifest lists %d of the %d page files: %+v", listed, len(want), m.Files)
	}
	for name, data := range want {
		got, err := os.ReadFile(filepath.Join(final, CRIUDir, name))
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("%s: %d bytes, want %d (%v)", name, len(got), len(data), err)
		}
	}
}

// Aborting a staging whose page file is half received stops its workers and removes it.
func TestAbortWithPagesFileOpen(t *testing.T) {
	s, err := Begin(filepath.Join(t.TempDir(), "img"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.CreatePages("pages-1.img")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Receive(0, HashChunkSize+4096, bytes.NewReader(make([]byte, HashChunkSize+4096))); err != nil {
		t.Fatal(err)
	}
	if err := s.Abort(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.Dir()); !os.IsNotExist(err) {
		t.Errorf("staging directory still there: %v", err)
	}
}
