package placement

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/gpu/amd/kfd"
)

// KFD_MAX_BUFFER_SIZE comes from the environment. ParseBufferSize returns a byte count
// that the same value with its unit multiplies out to, or an error; it never wraps around.
func FuzzParseBufferSize(f *testing.F) {
	for _, s := range []string{"0", "1073741824", "1024K", "1024k", "512M", "2G", "0x40000000", "0X10M",
		"17179869183G", "17179869184G", "18446744073709551615", "18446744073709551616", "", "K", "0x", "-1", "+1", "1.5G", "1T"} {
		f.Add(s, uint64(0), uint8(0))
	}
	f.Add("", uint64(math.MaxUint64>>30), uint8(3))
	f.Add("", uint64(math.MaxUint64>>30)+1, uint8(3))
	f.Fuzz(func(t *testing.T, s string, v uint64, unit uint8) {
		got, err := ParseBufferSize(s)
		if err == nil {
			if back, err := ParseBufferSize(strconv.FormatUint(got, 10)); err != nil || back != got {
				t.Fatalf("ParseBufferSize(%q) = %d, which reads back as %d, %v", s, got, back, err)
			}
		} else if !strings.Contains(err.Error(), "KFD_MAX_BUFFER_SIZE") {
			t.Fatalf("ParseBufferSize(%q): error %q does not name the variable", s, err)
		}

		suffix, shift := []string{"", "K", "M", "G", "k"}[unit%5], []uint{0, 10, 20, 30, 10}[unit%5]
		for _, form := range []string{strconv.FormatUint(v, 10), "0x" + strconv.FormatUint(v, 16)} {
			got, err := ParseBufferSize(form + suffix)
			fits := v <= math.MaxUint64>>shift
			if fits != (err == nil) || fits && got != v<<shift {
				t.Fatalf("ParseBufferSize(%q) = %d, %v; want %d << %d", form+suffix, got, err, v, shift)
			}
		}
	})
}

// topologies reads a host and an image topology from b: two CPU nodes, then GPUs with a
// gpu_id, a model, firmware, a hive, a NUMA node and xGMI links among the first eight,
// and a set of skipped checks. Small values make collisions, which make the search work.
func topologies(b []byte) (image, host []kfd.Node, skips Skips) {
	next := func() byte {
		if len(b) == 0 {
			return 0
		}
		c := b[0]
		b = b[1:]
		return c
	}
	skips = Skips{}
	mask := next()
	for i, c := range checks {
		if c.Env != "" && mask&(1<<i) != 0 {
			skips[c.Name] = true
		}
	}
	side := func(n int) []kfd.Node {
		nodes := []kfd.Node{{ID: 0, NUMANode: 0}, {ID: 1, NUMANode: 1}}
		for i := range n {
			id := uint32(len(nodes))
			g := kfd.Node{ID: id, GPUID: 100 + uint32(next()%8), VendorID: 0x1002, DeviceID: 0x738c + uint32(next()%2),
				SIMDCount: 480, FWVersion: uint32(next() % 3), SDMAFWVersion: 8, LocalMemSize: 32 << 30,
				HiveID: uint64(next() % 3), NUMANode: int(next()%3) - 1}
			links := next()
			for j := range min(i, 8) {
				if links&(1<<j) != 0 {
					g.IOLinks = append(g.IOLinks, kfd.IOLink{Type: kfd.LinkXGMI, NodeFrom: id, NodeTo: uint32(2 + j)})
				}
			}
			nodes = append(nodes, g)
		}
		return nodes
	}
	image = side(int(next() % 5))
	host = side(int(next() % 6))
	return image, host, skips
}

func peers(a, b kfd.Node) bool {
	linked := func(x, y kfd.Node) bool {
		for _, l := range x.IOLinks {
			if l.Type == kfd.LinkXGMI && l.NodeTo == y.ID {
				return true
			}
		}
		return false
	}
	return a.GPUID != b.GPUID && (a.HiveID != 0 && a.HiveID == b.HiveID || linked(a, b) || linked(b, a))
}

// valid says whether placing image GPU i on host GPU assign[i] passes every check Map makes.
func valid(img, host []kfd.Node, assign []int, skips Skips) bool {
	for i, h := range assign {
		if deviceCheck(img[i], host[h], skips) != nil {
			return false
		}
		for j := range i {
			a, b, ha, hb := img[i], img[j], host[h], host[assign[j]]
			if peers(a, b) != peers(ha, hb) {
				return false
			}
			if !skips[CheckNUMA] && a.NUMANode >= 0 && b.NUMANode >= 0 && ha.NUMANode >= 0 && hb.NUMANode >= 0 &&
				(a.NUMANode == b.NUMANode) != (ha.NUMANode == hb.NUMANode) {
				return false
			}
		}
	}
	return true
}

// anyValid tries every placement of the image GPUs on distinct host GPUs.
func anyValid(img, host []kfd.Node, skips Skips) bool {
	assign := make([]int, 0, len(img))
	used := make([]bool, len(host))
	var try func() bool
	try = func() bool {
		if len(assign) == len(img) {
			return valid(img, host, assign, skips)
		}
		for h := range host {
			if used[h] {
				continue
			}
			used[h], assign = true, append(assign, h)
			if valid(img, host, assign, skips) && try() {
				return true
			}
			used[h], assign = false, assign[:len(assign)-1]
		}
		return false
	}
	return try()
}

func distinctIDs(gpus []kfd.Node) bool {
	seen := map[uint32]bool{}
	for _, g := range gpus {
		if seen[g.GPUID] {
			return false
		}
		seen[g.GPUID] = true
	}
	return true
}

// Map places an image's GPUs, read from an image anyone can write, on this host's. It
// finds a placement whenever one passes every check (here checked against all of them), and
// what it returns passes them: each image GPU on its own host GPU, links and NUMA grouping
// kept. A host restored onto itself keeps every GPU where it was.
func FuzzMap(f *testing.F) {
	f.Add([]byte{0, 2, 3, 1, 0, 0, 0, 1, 0, 2, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0, 1})
	f.Add([]byte{0, 4, 5, 0, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 2, 0, 0, 1, 0, 0, 3, 0, 0, 1, 1, 0, 0, 4, 0, 0, 1, 1, 0})
	f.Add([]byte{0xff, 3, 3, 7, 1, 2, 2, 2, 0, 6, 1, 2, 2, 2, 1, 5, 1, 2, 2, 0, 3})
	f.Add([]byte{0, 2, 0, 0, 0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 2, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 1, 0}) // a hive onto PCIe
	f.Add([]byte{0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0})                                     // the same gpu_id twice
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		image, host, skips := topologies(data)
		imgGPUs, hostGPUs := kfd.GPUs(image), kfd.GPUs(host)
		got, err := Map(image, host, skips)
		if !distinctIDs(imgGPUs) || !distinctIDs(hostGPUs) {
			if err == nil || !strings.Contains(err.Error(), "twice") {
				t.Fatalf("a topology lists a gpu_id twice: Map = %v, %v", got, err)
			}
			return
		}
		possible := anyValid(imgGPUs, hostGPUs, skips)
		if err != nil {
			if !errors.Is(err, gpu.ErrIncompatible) {
				t.Fatalf("Map = %v: not gpu.ErrIncompatible", err)
			}
			if possible {
				t.Fatalf("Map = %v, but a valid placement exists", err)
			}
		} else {
			if !possible {
				t.Fatalf("Map = %v, but no placement passes every check", got)
			}
			if len(got) != len(imgGPUs) {
				t.Fatalf("Map placed %d of %d image GPUs", len(got), len(imgGPUs))
			}
			index := map[uint32]int{}
			for i, h := range hostGPUs {
				index[h.GPUID] = i
			}
			assign := make([]int, len(imgGPUs))
			taken := map[uint32]bool{}
			for i, g := range imgGPUs {
				h, ok := got[g.GPUID]
				if _, onHost := index[h]; !ok || !onHost || taken[h] {
					t.Fatalf("Map = %v: image GPU %d is not on a host GPU of its own", got, g.GPUID)
				}
				taken[h], assign[i] = true, index[h]
			}
			if !valid(imgGPUs, hostGPUs, assign, skips) {
				t.Fatalf("Map = %v fails a check", got)
			}
		}

		self, err := Map(host, host, skips)
		if err != nil || len(self) != len(hostGPUs) {
			t.Fatalf("the host onto itself: %v, %v", self, err)
		}
		for from, to := range self {
			if from != to {
				t.Fatalf("the host onto itself moves GPU %d to %d: %v", from, to, fmt.Sprint(self))
			}
		}
	})
}
