package rootonly

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gpucr/gpucr/internal/testutil"
)

const nobody = 65534

// Walk accepts a path only root can change, through root's own symlinks, and refuses one a
// user could redirect: through a directory of theirs, a symlink of theirs (in a sticky
// directory too), or a symlink whose target passes through either. A hostile test had a
// user's symlink, pointing at a root-only directory while the old Walk checked it, point
// at the user's own directory while root wrote through it.
func TestWalk(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "the test makes files of another user: it needs root")
	}
	base := t.TempDir()
	mk := func(rel string, mode os.FileMode, uid int) string {
		t.Helper()
		p := filepath.Join(base, rel)
		if err := os.Mkdir(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // past the umask, and the sticky bit
			t.Fatal(err)
		}
		if err := os.Chown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
		return p
	}
	link := func(rel, to string, uid int) string {
		t.Helper()
		p := filepath.Join(base, rel)
		if err := os.Symlink(to, p); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
		return p
	}
	safe := mk("safe", 0o755, 0)
	user := mk("user", 0o755, nobody)
	sticky := mk("sticky", 0o777|os.ModeSticky, 0)
	open := mk("open", 0o777, 0)
	mk("safe/inner", 0o755, 0)
	mk("user/inner", 0o755, nobody)

	for _, c := range []struct {
		path string
		want string // "" to accept
	}{
		{filepath.Join(safe, "inner"), ""},
		{filepath.Join(safe, "missing"), "no such file"},
		{link("rootlink", "safe/inner", 0), ""},
		{link("rootabs", filepath.Join(safe, "inner"), 0), ""},
		{filepath.Join(link("safe/up", "..", 0), "safe", "inner"), ""},
		{sticky, ""},
		{user, "not owned by root"},
		{open, "writable by users other than root"},
		{link("userlink", "safe/inner", nobody), "symlink not owned by root"},
		{link("sticky/userlink", filepath.Join(safe, "inner"), nobody), "symlink not owned by root"},
		{link("user/rootlink", filepath.Join(safe, "inner"), 0), "not owned by root"},
		{link("via-user", filepath.Join(user, "rootlink"), 0), "not owned by root"},
		{link("loop", "loop", 0), "too many levels"},
		// The kernel takes ".." from where a symlink led, not from where it lies.
		{link("safe/into-user", filepath.Join(user, "inner"), 0) + "/../inner", "not owned by root"},
	} {
		err := Walk(c.path)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("Walk(%s) = %v, want it accepted", c.path, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("Walk(%s) = %v, want an error naming %q", c.path, err, c.want)
		}
	}
}

// OpenDir reaches a directory as the kernel does, through root's symlinks (relative, with
// "..", or absolute), and refuses a user's symlink on the way or a path that ends in a file.
func TestOpenDir(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "needs root: the symlinks must be root's and another user's")
	}
	dir := t.TempDir()
	target := filepath.Join(dir, "a", "target")
	if err := os.MkdirAll(target, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for link, to := range map[string]string{"rel": "a/b/../target", "abs": target, "users": target} {
		if err := os.Symlink(to, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "a", "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(filepath.Join(dir, "users"), nobody, nobody); err != nil {
		t.Fatal(err)
	}
	var want syscall.Stat_t
	if err := syscall.Stat(target, &want); err != nil {
		t.Fatal(err)
	}
	for path, refused := range map[string]string{
		target:                           "",
		filepath.Join(dir, "rel"):        "",
		filepath.Join(dir, "abs", "."):   "",
		filepath.Join(dir, "users"):      "symlink not owned by root",
		filepath.Join(target, "file"):    "not a directory",
		filepath.Join(dir, "no", "such"): "no such file",
	} {
		fd, err := OpenDir(path)
		if refused != "" {
			if err == nil || !strings.Contains(err.Error(), refused) {
				t.Errorf("%s: %v, want %q", path, err, refused)
			}
			if err == nil {
				syscall.Close(fd)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		var got syscall.Stat_t
		if err := syscall.Fstat(fd, &got); err != nil || got.Ino != want.Ino || got.Dev != want.Dev {
			t.Errorf("%s opened another directory (%v)", path, err)
		}
		syscall.Close(fd)
	}
}
