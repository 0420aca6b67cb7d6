package chunked

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// A held file counts as unchanged only while its path still names it and nothing wrote
// it or renamed it since it was held; files not checked (logs) may change.
func TestHeldFilesSeeChanges(t *testing.T) {
	all := func(string) bool { return true }
	for name, change := range map[string]func(dir string) error{
		"written in place": func(dir string) error {
			f, err := os.OpenFile(filepath.Join(dir, "a.img"), os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.WriteAt([]byte("X"), 3)
			return err
		},
		"swapped for a copy": func(dir string) error {
			if err := os.WriteFile(filepath.Join(dir, "copy"), []byte("aaaaaaaa"), 0o600); err != nil {
				return err
			}
			return os.Rename(filepath.Join(dir, "copy"), filepath.Join(dir, "a.img"))
		},
		"swapped out and back": func(dir string) error {
			if err := os.Rename(filepath.Join(dir, "a.img"), filepath.Join(dir, "aside")); err != nil {
				return err
			}
			return os.Rename(filepath.Join(dir, "aside"), filepath.Join(dir, "a.img"))
		},
		"removed": func(dir string) error { return os.Remove(filepath.Join(dir, "a.img")) },
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range []string{"a.img", "b.img"} {
				if err := os.WriteFile(filepath.Join(dir, f), []byte("aaaaaaaa"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			h, err := holdFiles(dir, []string{"a.img", "b.img"})
			if err != nil {
				t.Fatal(err)
			}
			defer h.close()
			if err := h.unchanged(dir, all); err != nil {
				t.Fatalf("untouched: %v", err)
			}
			if err := change(dir); err != nil {
				t.Fatal(err)
			}
			if err := h.unchanged(dir, all); !errors.As(err, new(*changedError)) {
				t.Errorf("a.img %s: %v, want it seen as changed", name, err)
			}
			if err := h.unchanged(dir, func(p string) bool { return p == "b.img" }); err != nil {
				t.Errorf("a.img unchecked: %v", err)
			}
		})
	}
}
