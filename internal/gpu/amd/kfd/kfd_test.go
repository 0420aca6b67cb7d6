package kfd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type gpuWant struct {
	gpuID, node, simds, deviceID, fw, minor uint32
	numa                                    int
	vram, hive                              uint64
	xgmiPeers                               []uint32 // node IDs reached by xGMI links
}

// TestRead proves each fixture reads into the right GPUs, VRAM sums, hives, NUMA nodes
// and links.
func TestRead(t *testing.T) {
	const hive = 0x9b1f_6c2e_4d83_a511
	tests := []struct {
		fixture string
		nodes   int
		gpus    []gpuWant
	}{
		{"mi210", 2, []gpuWant{{gpuID: 53820, node: 1, simds: 416, deviceID: 0x740f, fw: 78, minor: 128, numa: 0, vram: 68702699520}}},
		{"pcie4-numa2", 6, []gpuWant{
			{gpuID: 18346, node: 2, simds: 480, deviceID: 0x738c, fw: 59, minor: 128, numa: 0, vram: 34342961152},
			{gpuID: 29493, node: 3, simds: 480, deviceID: 0x738c, fw: 59, minor: 129, numa: 0, vram: 34342961152},
			{gpuID: 51142, node: 4, simds: 480, deviceID: 0x738c, fw: 59, minor: 130, numa: 1, vram: 34342961152},
			{gpuID: 63541, node: 5, simds: 480, deviceID: 0x738c, fw: 59, minor: 131, numa: 1, vram: 34342961152},
		}},
		{"xgmi-hive4", 6, []gpuWant{
			{gpuID: 7126, node: 2, simds: 480, deviceID: 0x738c, fw: 59, minor: 128, numa: 0, vram: 34342961152, hive: hive, xgmiPeers: []uint32{3, 4, 5}},
			{gpuID: 19865, node: 3, simds: 480, deviceID: 0x738c, fw: 59, minor: 129, numa: 0, vram: 34342961152, hive: hive, xgmiPeers: []uint32{2, 4, 5}},
			{gpuID: 40211, node: 4, simds: 480, deviceID: 0x738c, fw: 59, minor: 130, numa: 1, vram: 34342961152, hive: hive, xgmiPeers: []uint32{2, 3, 5}},
			{gpuID: 61437, node: 5, simds: 480, deviceID: 0x738c, fw: 59, minor: 131, numa: 1, vram: 34342961152, hive: hive, xgmiPeers: []uint32{2, 3, 4}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.fixture, func(t *testing.T) {
			nodes, err := Read(filepath.Join("testdata", tt.fixture))
			if err != nil {
				t.Fatal(err)
			}
			if len(nodes) != tt.nodes {
				t.Fatalf("%d nodes, want %d", len(nodes), tt.nodes)
			}
			for i, n := range nodes {
				if n.ID != uint32(i) {
					t.Errorf("node %d has ID %d", i, n.ID)
				}
				if !n.IsGPU() && (n.NUMANode != int(n.ID) || n.CPUCoresCount == 0) {
					t.Errorf("CPU node %d: NUMA %d, %d cores", n.ID, n.NUMANode, n.CPUCoresCount)
				}
			}
			gpus := GPUs(nodes)
			if len(gpus) != len(tt.gpus) {
				t.Fatalf("%d GPUs, want %d", len(gpus), len(tt.gpus))
			}
			for i, w := range tt.gpus {
				g := gpus[i]
				if g.GPUID != w.gpuID || g.ID != w.node || g.SIMDCount != w.simds || g.DeviceID != w.deviceID ||
					g.FWVersion != w.fw || g.DRMRenderMinor != w.minor || g.NUMANode != w.numa ||
					g.LocalMemSize != w.vram || g.HiveID != w.hive || g.VendorID != 0x1002 {
					t.Errorf("GPU %d = %+v, want %+v", i, g, w)
				}
				if g.CachesCount != uint32(len(g.Caches)) || g.IOLinksCount != uint32(len(g.IOLinks)) || g.MemBanksCount != uint32(len(g.MemBanks)) {
					t.Errorf("GPU %d: counts %d/%d/%d disagree with %d caches, %d links, %d banks", g.GPUID,
						g.CachesCount, g.IOLinksCount, g.MemBanksCount, len(g.Caches), len(g.IOLinks), len(g.MemBanks))
				}
				var peers []uint32
				for _, l := range g.IOLinks {
					if l.Type == LinkXGMI {
						peers = append(peers, l.NodeTo)
					}
				}
				if !equalIDs(peers, w.xgmiPeers) {
					t.Errorf("GPU %d: xGMI peers %v, want %v", g.GPUID, peers, w.xgmiPeers)
				}
			}
		})
	}
}

func equalIDs(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestNUMAProperty proves a numa_node property wins over the io_link to a CPU node.
func TestNUMAProperty(t *testing.T) {
	root := copyFixture(t, "mi210")
	props := filepath.Join(root, "nodes/1/properties")
	data, err := os.ReadFile(props)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(props, append(data, "numa_node 3\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	nodes, err := Read(root)
	if err != nil {
		t.Fatal(err)
	}
	if got := GPUs(nodes)[0].NUMANode; got != 3 {
		t.Errorf("NUMA node %d, want 3 from the property", got)
	}
}

// TestReadErrors proves malformed trees fail with an error naming the offending file.
func TestReadErrors(t *testing.T) {
	tests := []struct {
		name, file, content, want string
	}{
		{"bad value", "nodes/1/properties", "simd_count lots\n", "nodes/1/properties:1: simd_count"},
		{"three fields", "nodes/1/properties", "simd_count 4 5\n", "nodes/1/properties:1: want"},
		{"duplicate", "nodes/1/properties", "simd_count 4\nsimd_count 5\n", "nodes/1/properties:2: simd_count given twice"},
		{"too wide", "nodes/1/properties", "fw_version 4294967296\n", "nodes/1/properties: fw_version"},
		{"bad gpu_id", "nodes/1/gpu_id", "gpu\n", "nodes/1/gpu_id"},
		{"bad bank", "nodes/1/mem_banks/0/properties", "size_in_bytes -1\n", "nodes/1/mem_banks/0/properties:1"},
		{"bad cache", "nodes/1/caches/2/properties", "level\n", "nodes/1/caches/2/properties:1"},
		{"foreign link", "nodes/1/io_links/0/properties", "type 2\nnode_from 0\nnode_to 1\n", "nodes/1/io_links/0/properties: node_from 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := copyFixture(t, "mi210")
			if err := os.WriteFile(filepath.Join(root, tt.file), []byte(tt.content), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := Read(root)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want it to contain %q", err, tt.want)
			}
		})
	}
	if _, err := Read(t.TempDir()); err == nil || !strings.Contains(err.Error(), "nodes") {
		t.Errorf("missing nodes dir: err = %v", err)
	}
	empty := t.TempDir()
	if err := os.Mkdir(filepath.Join(empty, "nodes"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(empty); err == nil || !strings.Contains(err.Error(), "no nodes") {
		t.Errorf("empty nodes dir: err = %v", err)
	}
}

func copyFixture(t *testing.T, name string) string {
	t.Helper()
	dst := t.TempDir()
	src := filepath.Join("testdata", name)
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	return dst
}
