package freezer

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/testutil"
)

// hierarchy is a cgroup hierarchy a test can make cgroups in: v1's freezer, v2's, or both
// on a hybrid host.
type hierarchy struct {
	name string
	top  string
	v1   bool
}

func available(t *testing.T) []hierarchy {
	t.Helper()
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "making cgroups needs root")
	}
	m, err := hierarchies()
	if err != nil {
		t.Fatal(err)
	}
	var hs []hierarchy
	if m.freezer.dir != "" {
		hs = append(hs, hierarchy{"v1", m.freezer.dir, true})
	}
	if m.unified.dir != "" {
		if _, err := os.Stat(filepath.Join(m.unified.dir, "cgroup.subtree_control")); err == nil {
			hs = append(hs, hierarchy{"v2", m.unified.dir, false})
		}
	}
	if len(hs) == 0 {
		testutil.SkipOrFail(t, "no cgroup freezer mounted")
	}
	return hs
}

// cgroup makes a cgroup under dir, removed (thawed, emptied) when the test ends.
func cgroup(t *testing.T, dir, name string, v1 bool) *Cgroup {
	t.Helper()
	d := filepath.Join(dir, name)
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	c := &Cgroup{Dir: d, v1: v1}
	t.Cleanup(func() {
		_ = c.Thaw()
		for range 100 {
			if os.Remove(d) == nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Errorf("cgroup %s left behind", d)
	})
	return c
}

func join(t *testing.T, c *Cgroup, pid int) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(c.Dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		t.Fatal(err)
	}
}

func TestHoldingFindsTheCgroupThatFroze(t *testing.T) {
	for _, h := range available(t) {
		t.Run(h.name, func(t *testing.T) {
			parent := cgroup(t, h.top, "gpucr-freezer-test-"+strconv.Itoa(os.Getpid()), h.v1)
			child := cgroup(t, parent.Dir, "box", h.v1)
			p := testutil.StartSleeper(t)
			join(t, child, p.Process.Pid)
			t.Cleanup(func() { _ = parent.Thaw(); testutil.KillAndReap(p.Process.Pid) })

			if c, err := Holding(p.Process.Pid); err != nil || c != nil {
				t.Fatalf("running process: held by %v, %v; want nothing", c, err)
			}
			// The freeze set on the parent holds the child's process: the parent is what to thaw.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := parent.Freeze(ctx); err != nil {
				t.Fatal(err)
			}
			c, err := Holding(p.Process.Pid)
			if err != nil || c == nil || c.Dir != parent.Dir {
				t.Fatalf("frozen process: held by %v, %v; want %s", c, err, parent.Dir)
			}
			if err := c.Thaw(); err != nil {
				t.Fatal(err)
			}
			if frozen, err := c.frozen(); err != nil || frozen {
				t.Fatalf("after Thaw: frozen=%v, %v", frozen, err)
			}
			if c, err := Holding(p.Process.Pid); err != nil || c != nil {
				t.Fatalf("thawed process: held by %v, %v", c, err)
			}
			if err := c.Freeze(ctx); err != nil {
				t.Fatal(err)
			}
			if frozen, err := c.frozen(); err != nil || !frozen {
				t.Fatalf("after Freeze: frozen=%v, %v", frozen, err)
			}
		})
	}
}

func TestMountJoinAndUnescape(t *testing.T) {
	dir := t.TempDir()
	mountInfo = filepath.Join(dir, "mountinfo")
	t.Cleanup(func() { mountInfo = "/proc/self/mountinfo" })
	testutil.WriteFile(t, mountInfo, []byte(`22 1 0:21 / /proc rw - proc proc rw
30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate
37 31 0:34 /kubepods /sys/fs/cgroup/free\040zer rw - cgroup cgroup rw,freezer
`))
	m, err := hierarchies()
	if err != nil {
		t.Fatal(err)
	}
	if m.unified.dir != "/sys/fs/cgroup" || m.freezer.dir != "/sys/fs/cgroup/free zer" || m.freezer.root != "/kubepods" {
		t.Fatalf("hierarchies: %+v", m)
	}
	if got := m.freezer.join("/kubepods/pod1/c1"); got != "/sys/fs/cgroup/free zer/pod1/c1" {
		t.Errorf("v1 join: %s", got)
	}
	if got := m.unified.join("/system.slice/x.scope"); got != "/sys/fs/cgroup/system.slice/x.scope" {
		t.Errorf("v2 join: %s", got)
	}
}
