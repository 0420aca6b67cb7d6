// Package freezer finds the cgroup that keeps a process frozen, and thaws and freezes it
// again. The CUDA driver locks, checkpoints and resumes a process by having the process
// itself take part: on a process frozen with its cgroup those calls wait for as long as it
// stays frozen, whatever their timeout. containerd and CRI-O freeze a container before they
// have runc dump it (for a consistent copy of its root filesystem), so the GPU step of
// their checkpoints has to thaw it for the driver and leave it frozen as it was found.
package freezer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gpucr/gpucr/internal/proctree"
)

// Cgroup is a cgroup whose own freezer is set: cgroup v2's cgroup.freeze, or cgroup v1's
// freezer hierarchy.
type Cgroup struct {
	Dir string // its directory under the cgroup file system
	v1  bool
}

func (c *Cgroup) String() string { return c.Dir }

// procRoot and mountInfo are where the kernel says which cgroups a process is in and
// where the hierarchies are mounted; tests point them elsewhere.
var (
	procRoot  = "/proc"
	mountInfo = "/proc/self/mountinfo"
)

// Holding returns the cgroup that freezes pid (its own or an ancestor, whichever set the
// freeze), or nil when none does.
func Holding(pid int) (*Cgroup, error) {
	paths, err := cgroupPaths(pid)
	if err != nil {
		return nil, err
	}
	mounts, err := hierarchies()
	if err != nil {
		return nil, err
	}
	if p, ok := paths["freezer"]; ok && mounts.freezer.dir != "" {
		c, err := holding(mounts.freezer.join(p), mounts.freezer.dir, true)
		if c != nil || err != nil {
			return c, err
		}
	}
	if p, ok := paths[""]; ok && mounts.unified.dir != "" {
		return holding(mounts.unified.join(p), mounts.unified.dir, false)
	}
	return nil, nil
}

// holding walks from dir up to the hierarchy's top for the cgroup that set the freeze,
// when dir is frozen at all.
func holding(dir, top string, v1 bool) (*Cgroup, error) {
	frozen, err := (&Cgroup{Dir: dir, v1: v1}).frozen()
	if err != nil || !frozen {
		return nil, err
	}
	for d := dir; strings.HasPrefix(d, top); d = filepath.Dir(d) {
		self, err := selfFreezing(d, v1)
		if err != nil {
			return nil, err
		}
		if self {
			return &Cgroup{Dir: d, v1: v1}, nil
		}
		if d == top {
			break
		}
	}
	return nil, fmt.Errorf("cgroup %s is frozen, but no cgroup above it says it froze it", dir)
}

func selfFreezing(dir string, v1 bool) (bool, error) {
	name, want := "cgroup.freeze", "1"
	if v1 {
		name = "freezer.self_freezing"
	}
	b, err := os.ReadFile(filepath.Join(dir, name))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil // the root cgroup has no freeze of its own
	}
	if err != nil {
		return false, fmt.Errorf("read cgroup freezer: %w", err)
	}
	return strings.TrimSpace(string(b)) == want, nil
}

// frozen reports whether c's processes are frozen (v1: FROZEN, or still FREEZING; v2:
// cgroup.events says frozen). A hierarchy's root cgroup, which has neither file, never is.
func (c *Cgroup) frozen() (bool, error) {
	name := "cgroup.events"
	if c.v1 {
		name = "freezer.state"
	}
	b, err := os.ReadFile(filepath.Join(c.Dir, name))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read cgroup freezer: %w", err)
	}
	if c.v1 {
		s := strings.TrimSpace(string(b))
		return s == "FROZEN" || s == "FREEZING", nil
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "frozen "); ok {
			return v == "1", nil
		}
	}
	return false, nil
}

// Thaw lets c's processes run again.
func (c *Cgroup) Thaw() error {
	if err := c.write("THAWED", "0"); err != nil {
		return fmt.Errorf("thaw cgroup %s: %w", c.Dir, err)
	}
	return nil
}

// Freeze freezes c again and waits, until ctx ends, for every process in it to be frozen.
func (c *Cgroup) Freeze(ctx context.Context) error {
	if err := c.write("FROZEN", "1"); err != nil {
		return fmt.Errorf("freeze cgroup %s: %w", c.Dir, err)
	}
	for {
		if c.v1 {
			// A v1 cgroup stays FREEZING until every task is frozen: asking again moves it on.
			if err := c.write("FROZEN", ""); err != nil {
				return fmt.Errorf("freeze cgroup %s: %w", c.Dir, err)
			}
		}
		done, err := c.settled()
		if err != nil || done {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("freeze cgroup %s: %w", c.Dir, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// settled is true once a freeze has reached every process (v1 FROZEN, not FREEZING).
func (c *Cgroup) settled() (bool, error) {
	if !c.v1 {
		return c.frozen()
	}
	b, err := os.ReadFile(filepath.Join(c.Dir, "freezer.state"))
	if err != nil {
		return false, fmt.Errorf("read cgroup freezer: %w", err)
	}
	return strings.TrimSpace(string(b)) == "FROZEN", nil
}

func (c *Cgroup) write(v1, v2 string) error {
	name, v := "cgroup.freeze", v2
	if c.v1 {
		name, v = "freezer.state", v1
	}
	return os.WriteFile(filepath.Join(c.Dir, name), []byte(v), 0)
}

// cgroupPaths reads /proc/PID/cgroup: each v1 controller's path, and v2's under "".
func cgroupPaths(pid int) (map[string]string, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return nil, fmt.Errorf("read cgroups of process %d: %w", pid, err)
	}
	paths := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) != 3 {
			continue
		}
		if f[0] == "0" && f[1] == "" {
			paths[""] = f[2]
			continue
		}
		for _, ctl := range strings.Split(f[1], ",") {
			paths[ctl] = f[2]
		}
	}
	return paths, nil
}

// mount is where a cgroup hierarchy is mounted and which of its cgroups is the mount's top.
type mount struct{ dir, root string }

// join is the directory of cgroup path (as /proc/PID/cgroup names it) under m.
func (m mount) join(path string) string {
	rel, ok := strings.CutPrefix(path, m.root)
	if !ok || m.root == "/" {
		rel = path
	}
	return filepath.Join(m.dir, rel)
}

type mounts struct{ freezer, unified mount }

// hierarchies finds the v1 freezer hierarchy and the v2 one in mountinfo.
func hierarchies() (mounts, error) {
	all, err := proctree.ReadMounts(mountInfo)
	if err != nil {
		return mounts{}, fmt.Errorf("find cgroup mounts: %w", err)
	}
	var m mounts
	for _, a := range all {
		switch at := (mount{dir: a.Dir, root: a.Root}); {
		case a.FSType == "cgroup2" && m.unified.dir == "":
			m.unified = at
		case a.FSType == "cgroup" && m.freezer.dir == "" && hasOption(a.Options, "freezer"):
			m.freezer = at
		}
	}
	return m, nil
}

func hasOption(opts, want string) bool {
	for _, o := range strings.Split(opts, ",") {
		if o == want {
			return true
		}
	}
	return false
}
