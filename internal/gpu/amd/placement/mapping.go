package placement

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/gpu/amd/kfd"
)

// Map chooses a distinct host GPU for every GPU of a checkpoint: image and host list KFD
// nodes (CPU nodes may be included and are ignored). The result maps image gpu_id to host
// gpu_id. Every enabled check must hold for each pair, and every two image GPUs keep how
// they were linked: xGMI peers (same hive or a direct xGMI link) go to xGMI peers, GPUs
// that only shared PCIe go to GPUs that only share PCIe, and with the numa check on, GPUs
// keep sharing, or not sharing, a CPU NUMA region.
//
// The search is a backtracking one over image GPUs in gpu_id order, trying the host GPU
// with the same gpu_id first and then host GPUs in gpu_id order, so the answer is the
// first valid assignment in that order and the same on every run. When none exists, the
// error names the first check that refused the deepest partial assignment reached. A
// topology read from an image may be built to make the search exponential: it gives up
// after maxTries placements tried.
func Map(image, host []kfd.Node, skips Skips) (map[uint32]uint32, error) {
	s := &search{img: newSide(image), host: newSide(host), skips: skips}
	for _, side := range []struct {
		name string
		gpus []kfd.Node
	}{{"image", s.img.gpus}, {"host", s.host.gpus}} {
		for i := 1; i < len(side.gpus); i++ {
			if side.gpus[i].GPUID == side.gpus[i-1].GPUID {
				return nil, fmt.Errorf("map AMD GPUs: the %s lists gpu_id %d twice", side.name, side.gpus[i].GPUID)
			}
		}
	}
	if len(s.img.gpus) > len(s.host.gpus) {
		return nil, fmt.Errorf("%w: the image has %d GPUs, this host %d", gpu.ErrIncompatible, len(s.img.gpus), len(s.host.gpus))
	}
	s.assign = make([]int, len(s.img.gpus))
	s.used = make([]bool, len(s.host.gpus))
	if !s.place(0) {
		if s.tries > maxTries {
			return nil, fmt.Errorf("%w: no placement of the image's %d GPUs on this host's %d found in %d tries", gpu.ErrIncompatible, len(s.img.gpus), len(s.host.gpus), maxTries)
		}
		return nil, s.failure()
	}
	out := make(map[uint32]uint32, len(s.assign))
	for i, h := range s.assign {
		out[s.img.gpus[i].GPUID] = s.host.gpus[h].GPUID
	}
	return out, nil
}

// side is one topology's GPUs in gpu_id order and which pairs of them are xGMI peers.
type side struct {
	gpus []kfd.Node
	peer [][]bool
}

func newSide(nodes []kfd.Node) side {
	gpus := slices.Clone(kfd.GPUs(nodes))
	slices.SortFunc(gpus, func(a, b kfd.Node) int { return cmp.Compare(a.GPUID, b.GPUID) })
	peer := make([][]bool, len(gpus))
	for i, a := range gpus {
		peer[i] = make([]bool, len(gpus))
		for j, b := range gpus {
			peer[i][j] = i != j && (a.HiveID != 0 && a.HiveID == b.HiveID || xgmiLinked(a, b) || xgmiLinked(b, a))
		}
	}
	return side{gpus, peer}
}

func xgmiLinked(from, to kfd.Node) bool {
	return slices.ContainsFunc(from.IOLinks, func(l kfd.IOLink) bool { return l.Type == kfd.LinkXGMI && l.NodeTo == to.ID })
}

// maxTries bounds the placements Map tries: far more than any real topology needs (8
// GPUs of one hive onto 8 take 8), a fraction of a second of work.
const maxTries = 1 << 18

type search struct {
	img, host side
	skips     Skips
	assign    []int  // image GPU index -> host GPU index, for the first len(placed) image GPUs
	used      []bool // host GPU index -> taken
	best      []int  // the deepest partial assignment reached, first found
	reached   bool   // whether best is set
	blocked   error  // the first refusal met extending best
	tries     int    // placements tried so far
}

func (s *search) place(i int) bool {
	if i == len(s.img.gpus) {
		return true
	}
	owner := !s.reached || i > len(s.best)
	if owner {
		s.reached = true
		s.best, s.blocked = slices.Clone(s.assign[:i]), nil
	}
	for _, h := range s.candidates(i) {
		if s.used[h] {
			continue
		}
		if s.tries++; s.tries > maxTries {
			return false
		}
		if err := s.fits(i, h); err != nil {
			if owner && len(s.best) == i && s.blocked == nil {
				s.blocked = err
			}
			continue
		}
		s.assign[i], s.used[h] = h, true
		if s.place(i + 1) {
			return true
		}
		s.used[h] = false
	}
	return false
}

// candidates lists host GPU indexes for image GPU i: the same gpu_id first, then the rest
// in gpu_id order.
func (s *search) candidates(i int) []int {
	id := s.img.gpus[i].GPUID
	out := make([]int, 0, len(s.host.gpus))
	for h, g := range s.host.gpus {
		if g.GPUID == id {
			out = append(out, h)
		}
	}
	for h, g := range s.host.gpus {
		if g.GPUID != id {
			out = append(out, h)
		}
	}
	return out
}

// fits checks image GPU i on host GPU h against the device checks and against every image
// GPU placed before it.
func (s *search) fits(i, h int) error {
	a, ha := s.img.gpus[i], s.host.gpus[h]
	if err := deviceCheck(a, ha, s.skips); err != nil {
		return err
	}
	for j, hb := range s.assign[:i] {
		b, hbn := s.img.gpus[j], s.host.gpus[hb]
		pair := func() string {
			return fmt.Sprintf("image GPUs %d and %d on host GPUs %d and %d", a.GPUID, b.GPUID, ha.GPUID, hbn.GPUID)
		}
		if s.img.peer[i][j] != s.host.peer[h][hb] {
			return incompatible(checkLinks, pair(), "link kind must be kept", linkKind(s.img.peer[i][j]), linkKind(s.host.peer[h][hb]))
		}
		if s.skips[CheckNUMA] || a.NUMANode < 0 || b.NUMANode < 0 || ha.NUMANode < 0 || hbn.NUMANode < 0 {
			continue
		}
		if (a.NUMANode == b.NUMANode) != (ha.NUMANode == hbn.NUMANode) {
			return incompatible(CheckNUMA, pair(), "CPU NUMA grouping must be kept", numaPair(a, b), numaPair(ha, hbn))
		}
	}
	return nil
}

func linkKind(peer bool) string {
	if peer {
		return "xGMI peers"
	}
	return "PCIe only"
}

func numaPair(a, b kfd.Node) string {
	if a.NUMANode == b.NUMANode {
		return fmt.Sprintf("both in NUMA node %d", a.NUMANode)
	}
	return fmt.Sprintf("in NUMA nodes %d and %d", a.NUMANode, b.NUMANode)
}

// failure explains the deepest partial assignment reached and why it could go no further.
func (s *search) failure() error {
	placed := make([]string, len(s.best))
	for i, h := range s.best {
		placed[i] = fmt.Sprintf("%d->%d", s.img.gpus[i].GPUID, s.host.gpus[h].GPUID)
	}
	after := "with none placed"
	if len(placed) > 0 {
		after = "after placing " + strings.Join(placed, ", ")
	}
	return fmt.Errorf("no host GPU can take image GPU %d %s; first refusal: %w", s.img.gpus[len(s.best)].GPUID, after, s.blocked)
}
