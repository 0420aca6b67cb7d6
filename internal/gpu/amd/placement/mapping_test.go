package placement

import (
	"errors"
	"fmt"
	"maps"
	"math/rand"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/gpu/amd/kfd"
)

func fixture(t *testing.T, name string) []kfd.Node {
	t.Helper()
	nodes, err := kfd.Read(filepath.Join("..", "kfd", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return nodes
}

// keep returns the CPU nodes of nodes and the GPUs with the given gpu_ids, changed by edit.
func keep(nodes []kfd.Node, edit func(*kfd.Node), ids ...uint32) []kfd.Node {
	var out []kfd.Node
	for _, n := range nodes {
		if !n.IsGPU() || slices.Contains(ids, n.GPUID) {
			if n.IsGPU() && edit != nil {
				edit(&n)
			}
			out = append(out, n)
		}
	}
	return out
}

// renumber gives the GPUs of nodes new gpu_ids, as another host would have.
func renumber(nodes []kfd.Node, ids map[uint32]uint32) []kfd.Node {
	out := slices.Clone(nodes)
	for i := range out {
		if id, ok := ids[out[i].GPUID]; ok {
			out[i].GPUID = id
		}
	}
	return out
}

// TestMapFixtures proves mapping on the realistic topologies: identity when possible,
// NUMA and xGMI structure kept on another host, and each kind of refusal explained.
func TestMapFixtures(t *testing.T) {
	pcie, hive, mi210 := fixture(t, "pcie4-numa2"), fixture(t, "xgmi-hive4"), fixture(t, "mi210")
	other := renumber(pcie, map[uint32]uint32{18346: 100, 29493: 200, 51142: 300, 63541: 400})
	tests := []struct {
		name        string
		image, host []kfd.Node
		skips       Skips
		want        map[uint32]uint32
		wantErr     string
	}{
		{name: "same host", image: pcie, host: pcie,
			want: map[uint32]uint32{18346: 18346, 29493: 29493, 51142: 51142, 63541: 63541}},
		{name: "same hive", image: hive, host: hive,
			want: map[uint32]uint32{7126: 7126, 19865: 19865, 40211: 40211, 61437: 61437}},
		{name: "another host, lowest ids", image: pcie, host: other,
			want: map[uint32]uint32{18346: 100, 29493: 200, 51142: 300, 63541: 400}},
		{name: "two GPUs of two NUMA nodes on another host", image: keep(pcie, nil, 29493, 63541), host: other,
			want: map[uint32]uint32{29493: 100, 63541: 300}},
		{name: "identity first, then NUMA-consistent lowest", image: keep(pcie, nil, 29493, 63541), host: renumber(pcie, map[uint32]uint32{18346: 1, 51142: 2}),
			want: map[uint32]uint32{29493: 29493, 63541: 63541}},
		{name: "NUMA split kept", image: keep(pcie, nil, 18346, 51142), host: keep(other, nil, 100, 200, 300),
			want: map[uint32]uint32{18346: 100, 51142: 300}},
		{name: "NUMA split impossible", image: keep(pcie, nil, 18346, 51142), host: keep(other, nil, 100, 200),
			wantErr: "image GPUs 51142 and 18346 on host GPUs 200 and 100: CPU NUMA grouping must be kept: image in NUMA nodes 1 and 0, host both in NUMA node 0 (skip with --skip-check numa or KFD_NUMA_CHECK=0)"},
		{name: "NUMA split skipped", image: keep(pcie, nil, 18346, 51142), host: keep(other, nil, 100, 200), skips: Skips{CheckNUMA: true},
			want: map[uint32]uint32{18346: 100, 51142: 200}},
		{name: "hive onto PCIe", image: hive, host: pcie,
			wantErr: "image GPUs 19865 and 7126 on host GPUs 29493 and 18346: link kind must be kept: image xGMI peers, host PCIe only (this check cannot be switched off)"},
		{name: "PCIe onto hive", image: keep(pcie, nil, 18346, 29493), host: hive, wantErr: "image PCIe only, host xGMI peers"},
		{name: "one hive GPU onto PCIe", image: keep(hive, nil, 40211), host: pcie, want: map[uint32]uint32{40211: 18346}},
		{name: "other model", image: mi210, host: pcie,
			wantErr: "no host GPU can take image GPU 53820 with none placed; first refusal: image GPU 53820 on host GPU 18346: model"},
		{name: "newer firmware in the image", image: keep(pcie, func(n *kfd.Node) { n.FWVersion = 60 }, 29493), host: pcie,
			wantErr: "image GPU 29493 on host GPU 29493: fw_version (host must be >= image): image 60, host 59 (skip with --skip-check fw-version or KFD_FW_VER_CHECK=0)"},
		{name: "newer firmware skipped", image: keep(pcie, func(n *kfd.Node) { n.FWVersion = 60 }, 29493), host: pcie, skips: Skips{CheckFW: true},
			want: map[uint32]uint32{29493: 29493}},
		{name: "one GPU too small", image: pcie, host: keep(other, func(n *kfd.Node) {
			if n.GPUID == 400 {
				n.LocalMemSize = 16 << 30
			}
		}, 100, 200, 300, 400), wantErr: "after placing 18346->100, 29493->200, 51142->300; first refusal: image GPU 63541 on host GPU 400: VRAM bytes"},
		{name: "too few GPUs", image: pcie, host: mi210, wantErr: "the image has 4 GPUs, this host 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Map(tt.image, tt.host, tt.skips)
			if tt.wantErr != "" {
				if !errors.Is(err, gpu.ErrIncompatible) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want gpu.ErrIncompatible containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(got, tt.want) {
				t.Errorf("Map = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestMapDuplicateGPUID proves a topology listing one gpu_id twice is refused as bad input.
func TestMapDuplicateGPUID(t *testing.T) {
	nodes := []kfd.Node{mi100(5), mi100(5)}
	if _, err := Map(nodes, nodes, nil); err == nil || errors.Is(err, gpu.ErrIncompatible) || !strings.Contains(err.Error(), "gpu_id 5 twice") {
		t.Errorf("err = %v", err)
	}
}

// A topology built so that no placement exists and every partial one looks fine (16 xGMI
// peers onto 15 peers and a loner) would take 15! tries: Map gives up, refusing the image.
func TestMapGivesUpOnAnExponentialSearch(t *testing.T) {
	var image, host []kfd.Node
	for i := range uint32(16) {
		g := mi100(100 + i)
		g.ID, g.HiveID = 2+i, 7
		image = append(image, g)
		if i == 15 {
			g.HiveID = 0
		}
		host = append(host, g)
	}
	_, err := Map(image, host, nil)
	if !errors.Is(err, gpu.ErrIncompatible) || !strings.Contains(err.Error(), "tries") {
		t.Fatalf("Map = %v, want a refusal saying the search gave up", err)
	}
}

// randomTopology builds n GPUs with gpu_ids from a small pool (so image and host share
// some), properties from small ranges, NUMA nodes 0/1, hives and direct xGMI links.
func randomTopology(r *rand.Rand, n int) []kfd.Node {
	ids := r.Perm(8)[:n]
	device := uint32(0x738c)
	if r.Intn(10) == 0 {
		device = 0x740f
	}
	nodes := make([]kfd.Node, n)
	for i := range nodes {
		g := &nodes[i]
		*g = kfd.Node{
			ID: uint32(i + 2), GPUID: uint32(ids[i] + 1), VendorID: 0x1002, DeviceID: device, SIMDCount: 480,
			FWVersion: uint32(58 + r.Intn(2)), SDMAFWVersion: uint32(17 + r.Intn(2)), CachesCount: uint32(3 + r.Intn(2)),
			NumGWS: 64, LocalMemSize: uint64(1+r.Intn(2)) << 30, NUMANode: r.Intn(2),
		}
		if r.Intn(6) == 0 {
			g.NumGWS = 0
		}
		if r.Intn(10) == 0 {
			g.Capability = 1
		}
		if r.Intn(4) == 0 {
			g.HiveID = uint64(1 + r.Intn(2))
		}
	}
	for i := range nodes {
		for j := range nodes {
			if i != j && r.Intn(10) == 0 {
				nodes[i].IOLinks = append(nodes[i].IOLinks, kfd.IOLink{Type: kfd.LinkXGMI, NodeFrom: nodes[i].ID, NodeTo: nodes[j].ID})
			}
		}
	}
	return nodes
}

// oracle is an independent statement of the rules, written against the checks' meaning
// rather than Map's code.
func oracleValid(image, host []kfd.Node, m map[uint32]uint32, skips Skips) bool {
	byID := func(nodes []kfd.Node, id uint32) kfd.Node {
		return nodes[slices.IndexFunc(nodes, func(n kfd.Node) bool { return n.GPUID == id })]
	}
	peers := func(a, b kfd.Node) bool {
		direct := func(x, y kfd.Node) bool {
			for _, l := range x.IOLinks {
				if l.Type == kfd.LinkXGMI && l.NodeTo == y.ID {
					return true
				}
			}
			return false
		}
		return (a.HiveID != 0 && a.HiveID == b.HiveID) || direct(a, b) || direct(b, a)
	}
	seen := map[uint32]bool{}
	for ia, ha := range m {
		if seen[ha] {
			return false
		}
		seen[ha] = true
		a, h := byID(image, ia), byID(host, ha)
		if a.VendorID != h.VendorID || a.DeviceID != h.DeviceID || a.SIMDCount != h.SIMDCount ||
			!skips[CheckFW] && h.FWVersion < a.FWVersion ||
			!skips[CheckSDMAFW] && h.SDMAFWVersion < a.SDMAFWVersion ||
			!skips[CheckCaches] && h.CachesCount < a.CachesCount ||
			!skips[CheckGWS] && h.NumGWS < a.NumGWS ||
			!skips[CheckVRAM] && h.LocalMemSize < a.LocalMemSize ||
			!skips[CheckCapability] && h.Capability != a.Capability {
			return false
		}
		for ib, hb := range m {
			if ia == ib {
				continue
			}
			b, g := byID(image, ib), byID(host, hb)
			if peers(a, b) != peers(h, g) {
				return false
			}
			if !skips[CheckNUMA] && (a.NUMANode == b.NUMANode) != (h.NUMANode == g.NUMANode) {
				return false
			}
		}
	}
	return true
}

// bruteForce tries every injective assignment, image GPUs in gpu_id order each taking the
// same gpu_id first and then ascending ones, and returns the first valid one.
func bruteForce(image, host []kfd.Node, skips Skips) map[uint32]uint32 {
	img := slices.Clone(image)
	slices.SortFunc(img, func(a, b kfd.Node) int { return int(a.GPUID) - int(b.GPUID) })
	m := map[uint32]uint32{}
	var try func(i int) bool
	try = func(i int) bool {
		if i == len(img) {
			return oracleValid(image, host, m, skips)
		}
		var order []uint32
		for _, h := range host {
			order = append(order, h.GPUID)
		}
		slices.Sort(order)
		if j := slices.Index(order, img[i].GPUID); j >= 0 {
			order = append([]uint32{img[i].GPUID}, slices.Delete(order, j, j+1)...)
		}
		for _, h := range order {
			if slices.Contains(slices.Collect(maps.Values(m)), h) {
				continue
			}
			m[img[i].GPUID] = h
			if try(i + 1) {
				return true
			}
			delete(m, img[i].GPUID)
		}
		return false
	}
	if try(0) {
		return m
	}
	return nil
}

// TestMapMatchesBruteForce proves, on random topologies, that Map finds a mapping exactly
// when one exists, that it is the first valid one in preference order (so deterministic
// and identity-first), and that its refusals are gpu.ErrIncompatible.
func TestMapMatchesBruteForce(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	var found, refused int
	for c := range 400 {
		n := 2 + r.Intn(4)   // 2-5 image GPUs
		m := n + r.Intn(7-n) // n-6 host GPUs, and now and then fewer
		if r.Intn(8) == 0 {
			m = 2 + r.Intn(5)
		}
		image, host := randomTopology(r, n), randomTopology(r, m)
		skips := Skips{}
		for _, ch := range checks {
			if ch.Env != "" && r.Intn(2) == 0 {
				skips[ch.Name] = true
			}
		}
		want := bruteForce(image, host, skips)
		got, err := Map(image, host, skips)
		desc := fmt.Sprintf("case %d: image %s, host %s, skips %v", c, describe(image), describe(host), skips)
		switch {
		case want == nil && err == nil:
			t.Fatalf("%s: Map found %v, brute force found none", desc, got)
		case want != nil && err != nil:
			t.Fatalf("%s: Map failed (%v), brute force found %v", desc, err, want)
		case err != nil && !errors.Is(err, gpu.ErrIncompatible):
			t.Fatalf("%s: refusal %v is not gpu.ErrIncompatible", desc, err)
		case err == nil && !maps.Equal(got, want):
			t.Fatalf("%s: Map = %v, want the first valid mapping %v", desc, got, want)
		case err == nil && !oracleValid(image, host, got, skips):
			t.Fatalf("%s: Map = %v breaks a rule", desc, got)
		}
		if err == nil {
			found++
		} else {
			refused++
		}
	}
	t.Logf("%d mapped, %d refused", found, refused)
	if found < 40 || refused < 40 {
		t.Errorf("random cases too one-sided to mean much: %d mapped, %d refused", found, refused)
	}
}

func describe(nodes []kfd.Node) string {
	var parts []string
	for _, n := range nodes {
		parts = append(parts, fmt.Sprintf("{id %d node %d dev %x fw %d sdma %d caches %d gws %d vram %d cap %d numa %d hive %d links %v}",
			n.GPUID, n.ID, n.DeviceID, n.FWVersion, n.SDMAFWVersion, n.CachesCount, n.NumGWS, n.LocalMemSize>>30, n.Capability, n.NUMANode, n.HiveID, n.IOLinks))
	}
	return strings.Join(parts, " ")
}
