package archive

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpucr/gpucr/internal/image"
)

// Whatever bytes an archive holds, an import either refuses it and leaves nothing, or
// yields an image that verifies; it never writes beside or outside its destination.
func FuzzImport(f *testing.F) {
	for _, name := range []string{"c.tar", "c.tar.gz", "c.tar.zst"} {
		b, err := os.ReadFile(export(f, testImage(f, nil), name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, archive []byte) {
		root := t.TempDir()
		file := filepath.Join(root, "in.tar")
		if err := os.WriteFile(file, archive, 0o600); err != nil {
			t.Fatal(err)
		}
		sub := filepath.Join(root, "d")
		if err := os.Mkdir(sub, 0o700); err != nil {
			t.Fatal(err)
		}
		dest := filepath.Join(sub, "img")
		_, _, err := Import(context.Background(), file, dest, "", nil)
		left := leftovers(t, sub)
		switch {
		case err != nil && len(left) > 0:
			t.Fatalf("refused (%v) but left %v", err, left)
		case err == nil && (len(left) != 1 || left[0] != "img"):
			t.Fatalf("imported, and left %v", left)
		case err == nil:
			if _, err := image.Open(dest); err != nil {
				t.Fatalf("imported an image that does not verify: %v", err)
			}
		}
		if top := leftovers(t, root); len(top) != 2 {
			t.Fatalf("import wrote outside its destination: %v", top)
		}
	})
}
