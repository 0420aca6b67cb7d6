package container

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/gpucr/gpucr/internal/engine"
	"github.com/gpucr/gpucr/internal/proctree"
)

// innerPID is pid as the container's own PID namespace numbers it: the last NSpid field.
// Images record these, because a restored container gets new host PIDs and keeps these.
func innerPID(pid int) (int, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("read process %d: %w", pid, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "NSpid:"); ok {
			fields := strings.Fields(rest)
			if len(fields) == 0 {
				break
			}
			return strconv.Atoi(fields[len(fields)-1])
		}
	}
	return 0, fmt.Errorf("process %d: no NSpid in its status", pid)
}

// hostPIDs maps each process of the tree rooted at host PID root from its container PID
// to its host PID.
func hostPIDs(root int) (map[int]int, error) {
	tree, err := proctree.Tree(root)
	if err != nil {
		return nil, err
	}
	m := make(map[int]int, len(tree))
	for _, p := range tree {
		in, err := innerPID(p.PID)
		if err != nil {
			return nil, err
		}
		m[in] = p.PID
	}
	return m, nil
}

// toInner renumbers set from host PIDs to container PIDs; GPUSet.Renumber does the reverse
// with the map hostPIDs made. Backends work on host PIDs, images keep container PIDs.
func toInner(set engine.GPUSet) (engine.GPUSet, error) {
	out := make(engine.GPUSet, len(set))
	for i, p := range set {
		in, err := innerPID(p.PID)
		if err != nil {
			return nil, err
		}
		out[i] = p
		out[i].PID = in
	}
	return out, nil
}
