package image

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gpucr/gpucr/internal/diskroom"
	"github.com/gpucr/gpucr/internal/testutil"
)

// pinImage writes an image's layout under a new root-owned directory: a CRIU file and a
// memory file, 0600 in 0700 directories, as gpucr writes them.
func pinImage(t *testing.T) (string, []File) {
	t.Helper()
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "ownership checks need root")
	}
	dir := filepath.Join(t.TempDir(), "img")
	files := []File{{Path: "criu/core-1.img", Size: 4}, {Path: "mem/1-7f00.img", Size: 3}}
	for _, f := range files {
		p := filepath.Join(dir, filepath.FromSlash(f.Path))
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, make([]byte, f.Size), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir, files
}

// Only an image nobody but root can change is restored in place: a directory on its path
// others may write (but a sticky one above the image, as /tmp), its criu/ writable by
// others even with the sticky bit (they could add the optional images CRIU opens), or a
// CRIU file of another owner, all need the private copy. Memory files do not count: the
// fill verifies what it reads.
func TestOnlyRootCanChange(t *testing.T) {
	for _, c := range []struct {
		name string
		mess func(dir string) error
		want bool
	}{
		{"as gpucr writes it", func(string) error { return nil }, true},
		{"criu/ writable by others", func(d string) error { return os.Chmod(filepath.Join(d, "criu"), 0o777) }, false},
		{"criu/ sticky and writable by others", func(d string) error {
			return os.Chmod(filepath.Join(d, "criu"), 0o777|os.ModeSticky)
		}, false},
		{"parent writable by others", func(d string) error { return os.Chmod(filepath.Dir(d), 0o777) }, false},
		{"parent sticky and writable by others", func(d string) error {
			return os.Chmod(filepath.Dir(d), 0o777|os.ModeSticky)
		}, true},
		{"a CRIU file of another owner", func(d string) error { return os.Chown(filepath.Join(d, "criu", "core-1.img"), 65534, 65534) }, false},
		{"a CRIU file writable by its group", func(d string) error { return os.Chmod(filepath.Join(d, "criu", "core-1.img"), 0o660) }, false},
		{"a memory file of another owner", func(d string) error { return os.Chown(filepath.Join(d, "mem", "1-7f00.img"), 65534, 65534) }, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir, files := pinImage(t)
			if err := c.mess(dir); err != nil {
				t.Fatal(err)
			}
			got, err := OnlyRootCanChange(dir, files)
			if err != nil || got != c.want {
				t.Fatalf("OnlyRootCanChange = %v, %v; want %v", got, err, c.want)
			}
		})
	}
}

// The private copy holds what the image held when it was made: a file swapped in the
// image afterwards does not reach it. Memory files are not copied; a symlink in the image
// is never followed, and a missing file is named.
func TestPinCopiesWhatCRIUReads(t *testing.T) {
	dir, files := pinImage(t)
	testutil.WriteFile(t, filepath.Join(dir, "criu", "core-1.img"), []byte("good"))
	private := filepath.Join(t.TempDir(), "pinned")
	if err := Pin(dir, private, files); err != nil {
		t.Fatal(err)
	}
	evil := filepath.Join(t.TempDir(), "evil")
	testutil.WriteFile(t, evil, []byte("evil"))
	if err := os.Rename(evil, filepath.Join(dir, "criu", "core-1.img")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(private, "criu", "core-1.img")); err != nil || string(b) != "good" {
		t.Fatalf("pinned copy = %q, %v; want what the image held when pinned", b, err)
	}
	if _, err := os.Stat(filepath.Join(private, "mem")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("memory copied too (%v): the fill reads it from the image", err)
	}

	if err := os.Remove(filepath.Join(dir, "criu", "core-1.img")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "criu", "core-1.img")); err != nil {
		t.Fatal(err)
	}
	if err := Pin(dir, filepath.Join(t.TempDir(), "p2"), files); err == nil {
		t.Error("a symlink in the image was followed into the copy")
	}
	if err := os.Remove(filepath.Join(dir, "criu", "core-1.img")); err != nil {
		t.Fatal(err)
	}
	var ce *CorruptError
	if err := Pin(dir, filepath.Join(t.TempDir(), "p3"), files); !errors.As(err, &ce) {
		t.Errorf("pin of an image missing a file: %v, want it named as missing", err)
	}
}

// A relative path is judged as its absolute one (the walk up once never reached "/": a
// restore from the image's parent with a relative -D spun forever), and a path through a
// symlink is not the image's own: Resolve gives the one a restore reads through.
func TestOnlyRootCanChangeRelativeAndThroughSymlinks(t *testing.T) {
	dir, files := pinImage(t)
	t.Chdir(filepath.Dir(dir))
	if ok, err := OnlyRootCanChange(filepath.Base(dir), files); err != nil || !ok {
		t.Fatalf("relative path: %v, %v; want true", ok, err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	if ok, err := OnlyRootCanChange(link, files); err != nil || ok {
		t.Fatalf("through a symlink: %v, %v; want false", ok, err)
	}
	if got, err := Resolve(link); err != nil || got != dir {
		t.Fatalf("Resolve(%s) = %q, %v; want %q", link, got, err, dir)
	}
}

// Whoever may write in the image may grow a file after its size was checked: the copy took
// all of it, 256 MiB for a file listed at 4 bytes, into root's TMPDIR (review). It copies
// one byte past the listed size at most, which the check that follows refuses; and it
// refuses first what would fill the file system it copies into.
func TestPinCopiesNoMoreThanListed(t *testing.T) {
	dir, files := pinImage(t)
	core := filepath.Join(dir, "criu", "core-1.img")
	if err := os.Truncate(core, 256<<20); err != nil {
		t.Fatal(err)
	}
	private := filepath.Join(t.TempDir(), "pinned")
	if err := Pin(dir, private, files); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(private, "criu", "core-1.img")); err != nil || fi.Size() != 5 {
		t.Fatalf("copy of a file listed at 4 bytes: %v, %v; want 5 bytes", fi, err)
	}
	if err := CheckSizes(private, files[:1]); err == nil {
		t.Fatal("the grown file's copy passed the size check")
	}

	huge := slices.Clone(files)
	huge[0].Size = 1 << 50
	var full *diskroom.FullError
	if err := Pin(dir, filepath.Join(t.TempDir(), "p2"), huge); !errors.As(err, &full) {
		t.Fatalf("pin of a petabyte: %v, want the file system's room refused first", err)
	}
}
