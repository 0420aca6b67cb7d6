package rootonly

import (
	"os"
	"path/filepath"
	"strings"
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
