package beneath

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// A directory others can write is read and written by name, never through a symlink one
// of them put there: Replace neither writes into the file a leftover temporary name points
// to nor into the one the target name points to, and ReadFile refuses to read either.
func TestDirNeverFollowsSymlinks(t *testing.T) {
	root := t.TempDir()
	victim := filepath.Join(root, "victim")
	if err := os.WriteFile(victim, []byte("root's"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "image")
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"sig" + ReplaceSuffix, "sig"} {
		if err := os.Symlink(victim, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	d, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.ReadFile("sig", 1<<10); !errors.Is(err, unix.ELOOP) {
		t.Fatalf("ReadFile through a symlink = %v, want ELOOP", err)
	}
	if err := d.Replace("sig", []byte("new")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "root's" {
		t.Fatalf("the symlinks' target was written: %q", b)
	}
	if fi, err := os.Lstat(filepath.Join(dir, "sig")); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
		t.Fatalf("sig after Replace: %v, %v", fi, err)
	}
	if b, err := d.ReadFile("sig", 1<<10); err != nil || string(b) != "new" {
		t.Fatalf("sig holds %q, %v", b, err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "sig"+ReplaceSuffix)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the temporary name is left: %v", err)
	}
	if _, err := d.ReadFile("sig", 2); err == nil {
		t.Fatal("ReadFile beyond its limit succeeded")
	}
	if _, err := OpenDir(filepath.Join(dir, "sig")); err == nil {
		t.Fatal("OpenDir of a file succeeded")
	}
}

// A FIFO where a regular file belongs is refused at once, not waited on for a writer; a
// directory reached through a symlink, at its end or on the way, is not held.
func TestFIFOsAndSymlinkedDirsAreRefused(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir, "fifo"); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("Open of a FIFO = %v, want ErrNotRegular", err)
	}
	d, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.ReadFile("fifo", 1<<10); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("ReadFile of a FIFO = %v, want ErrNotRegular", err)
	}
	if !d.Is(dir) {
		t.Fatal("Is of the held directory's own path = false")
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{link, filepath.Join(link, ".")} {
		if _, err := OpenDir(p); !errors.Is(err, ErrSymlinkInPath) {
			t.Fatalf("OpenDir(%s) = %v, want ErrSymlinkInPath", p, err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenDir(filepath.Join(link, "sub")); !errors.Is(err, ErrSymlinkInPath) {
		t.Fatalf("OpenDir through a symlinked parent = %v, want ErrSymlinkInPath", err)
	}
}

// Reads through Within reach the directory held, not whatever is at its path by then: a
// directory renamed away and another put in its place between two reads changes nothing.
func TestWithinIsTheDirectoryHeld(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "image")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("held"), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := os.Rename(dir, filepath.Join(root, "away")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("swapped in"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := Open(d.Within(), "f")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 32)
	n, _ := f.Read(b)
	if string(b[:n]) != "held" {
		t.Fatalf("read %q through Within, want the held directory's %q", b[:n], "held")
	}
	if d.Is(dir) {
		t.Error("Is says the directory put in its place is the one held")
	}
}

// OpenDirAll makes what is missing and holds the last directory, and refuses a symlink
// anywhere on the way, one that is there already or one in what it would make.
func TestOpenDirAll(t *testing.T) {
	root, elsewhere := t.TempDir(), t.TempDir()
	d, err := OpenDirAll(filepath.Join(root, "a", "b", "c"), 0o700)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Is(filepath.Join(root, "a", "b", "c")) {
		t.Error("OpenDirAll holds another directory")
	}
	d.Close()
	if err := os.Symlink(elsewhere, filepath.Join(root, "a", "link")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"a/link", "a/link/x", "a/link/x/y"} {
		if d, err := OpenDirAll(filepath.Join(root, p), 0o700); !errors.Is(err, ErrSymlinkInPath) {
			t.Errorf("OpenDirAll(%s) = %v, %v; want a symlink refused", p, d, err)
		}
	}
	if es, _ := os.ReadDir(elsewhere); len(es) != 0 {
		t.Errorf("OpenDirAll made %d entries through the symlink", len(es))
	}
}

// LinkFile links the file held open, not what its name has become: a name swapped for a
// symlink after the file was opened and checked gives the new name the file, never the
// symlink.
func TestLinkFileLinksTheFileHeld(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("linkat(AT_EMPTY_PATH) needs CAP_DAC_READ_SEARCH")
	}
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "victim"), []byte("root's"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "f"), []byte("checked"), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := OpenDir(root)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	f, err := d.Open("f")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := os.Rename(filepath.Join(root, "f"), filepath.Join(root, "f.old")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("victim", filepath.Join(root, "f")); err != nil {
		t.Fatal(err)
	}
	if err := d.LinkFile(f, "link"); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(filepath.Join(root, "link"))
	if err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("link: %v, %v", fi, err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "link")); err != nil || string(b) != "checked" {
		t.Fatalf("link holds %q, %v", b, err)
	}
	if err := d.LinkFile(f, "link"); !errors.Is(err, os.ErrExist) {
		t.Fatalf("a name taken: %v, want %v", err, os.ErrExist)
	}
}
