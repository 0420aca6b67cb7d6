// Package imagetest builds images for tests: in particular images changed after their
// checkpoint and sealed again, as someone who can write an image would.
package imagetest

import (
	"crypto/ed25519"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpucr/gpucr/internal/image"
)

// Commit commits files (slash paths inside the image, and their bytes) as an image in a
// new directory, under manifest m, signed by key when not nil, and returns the directory.
func Commit(t testing.TB, files map[string][]byte, m *image.Manifest, key ed25519.PrivateKey) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "img")
	s, err := image.Begin(dir)
	if err != nil {
		t.Fatal(err)
	}
	s.SignWith = key
	for p, b := range files {
		full := filepath.Join(s.Dir(), filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Commit(m); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Recommit copies the image in dir into a new staging directory, lets change edit the
// staged files, and commits them under the same manifest, every file listed, checksummed
// and sealed again. It returns the new image's directory.
func Recommit(t *testing.T, dir string, change func(staged string)) string {
	t.Helper()
	return RecommitWith(t, dir, func(staged string, _ *image.Manifest) { change(staged) })
}

// RecommitWith is Recommit whose change may edit the manifest too.
func RecommitWith(t *testing.T, dir string, change func(staged string, m *image.Manifest)) string {
	t.Helper()
	m, err := image.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "img")
	s, err := image.Begin(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range m.Files {
		b, err := os.ReadFile(filepath.Join(dir, f.Path))
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(s.Dir(), f.Path)
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	change(s.Dir(), m)
	if err := s.Commit(m); err != nil {
		t.Fatal(err)
	}
	return out
}
