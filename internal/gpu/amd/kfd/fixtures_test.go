package kfd

import (
	"bytes"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/ topology trees from the generator")

// The fixtures are generated so that counts, links and reverse links stay consistent; the
// values are those of real MI100 and MI210 hosts.

type prop struct {
	key string
	val uint64
}

type fixNode struct {
	gpuID  uint32
	name   string
	props  []prop
	banks  [][]prop
	caches [][]prop
	links  [][]prop
}

// nodeOrder is the order in which KFD's node_show prints node properties.
var nodeOrder = []string{
	"cpu_cores_count", "simd_count", "mem_banks_count", "caches_count", "io_links_count",
	"p2p_links_count", "cpu_core_id_base", "simd_id_base", "max_waves_per_simd", "lds_size_in_kb",
	"gds_size_in_kb", "num_gws", "wave_front_size", "array_count", "simd_arrays_per_engine",
	"cu_per_simd_array", "simd_per_cu", "max_slots_scratch_cu", "gfx_target_version", "vendor_id",
	"device_id", "location_id", "domain", "drm_render_minor", "hive_id", "num_sdma_engines",
	"num_sdma_xgmi_engines", "num_sdma_queues_per_engine", "num_cp_queues", "max_engine_clk_fcompute",
	"local_mem_size", "fw_version", "capability", "debug_prop", "sdma_fw_version", "unique_id",
	"num_xcc", "max_engine_clk_ccompute",
}

func ordered(order []string, vals map[string]uint64) []prop {
	out := make([]prop, len(order))
	for i, k := range order {
		out[i] = prop{k, vals[k]}
	}
	return out
}

func cpuNode(id uint32, cores uint64, memBytes uint64) fixNode {
	return fixNode{
		props: ordered(nodeOrder, map[string]uint64{
			"cpu_cores_count": cores, "mem_banks_count": 1, "cpu_core_id_base": uint64(id) * cores,
			"max_engine_clk_ccompute": 3500,
		}),
		banks: [][]prop{{{"heap_type", 0}, {"size_in_bytes", memBytes}, {"flags", 0}, {"width", 72}, {"mem_clk_max", 3200}}},
	}
}

type gpuModel struct {
	name                         string
	simds, deviceID, gfx         uint64
	vram, fw, sdmaFW, capability uint64
	xgmiEngines                  uint64
}

var (
	mi100 = gpuModel{"gfx908", 480, 0x738c, 90008, 34342961152, 59, 18, 0x2e3a8280, 6}
	mi210 = gpuModel{"gfx90a", 416, 0x740f, 90010, 68702699520, 78, 8, 0x2c9a8280, 6}
)

// gpuNode describes a GPU at PCI bus `bus` whose io_links are filled in by link.
func gpuNode(m gpuModel, gpuID uint32, bus, minor, hive uint64) fixNode {
	caches := [][]prop{
		{{"processor_id_low", 0}, {"level", 1}, {"size", 16}, {"cache_line_size", 64}, {"cache_lines_per_tag", 1}, {"association", 4}, {"latency", 1}, {"type", 5}},
		{{"processor_id_low", 0}, {"level", 1}, {"size", 32}, {"cache_line_size", 64}, {"cache_lines_per_tag", 1}, {"association", 8}, {"latency", 1}, {"type", 3}},
		{{"processor_id_low", 0}, {"level", 1}, {"size", 16}, {"cache_line_size", 64}, {"cache_lines_per_tag", 1}, {"association", 4}, {"latency", 1}, {"type", 3}},
		{{"processor_id_low", 0}, {"level", 2}, {"size", 8192}, {"cache_line_size", 128}, {"cache_lines_per_tag", 1}, {"association", 16}, {"latency", 1}, {"type", 5}},
	}
	return fixNode{
		gpuID: gpuID, name: m.name,
		props: ordered(nodeOrder, map[string]uint64{
			"simd_count": m.simds, "mem_banks_count": 1, "caches_count": uint64(len(caches)),
			"simd_id_base": 2147487744 + bus*16, "max_waves_per_simd": 8, "lds_size_in_kb": 64,
			"num_gws": 64, "wave_front_size": 64, "array_count": 8, "simd_arrays_per_engine": 1,
			"cu_per_simd_array": m.simds / 4 / 8, "simd_per_cu": 4, "max_slots_scratch_cu": 32,
			"gfx_target_version": m.gfx, "vendor_id": 0x1002, "device_id": m.deviceID,
			"location_id": bus << 8, "drm_render_minor": minor, "hive_id": hive,
			"num_sdma_engines": 2, "num_sdma_xgmi_engines": m.xgmiEngines, "num_sdma_queues_per_engine": 8,
			"num_cp_queues": 24, "max_engine_clk_fcompute": 1502, "fw_version": m.fw,
			"capability": m.capability, "debug_prop": 1495, "sdma_fw_version": m.sdmaFW,
			"unique_id": 0x5a1c0000_00000000 | uint64(gpuID), "num_xcc": 1, "max_engine_clk_ccompute": 3500,
		}),
		banks:  [][]prop{{{"heap_type", 1}, {"size_in_bytes", m.vram}, {"flags", 0}, {"width", 4096}, {"mem_clk_max", 1200}}},
		caches: caches,
	}
}

var linkOrder = []string{
	"type", "version_major", "version_minor", "node_from", "node_to", "weight", "min_latency",
	"max_latency", "min_bandwidth", "max_bandwidth", "recommended_transfer_size", "flags",
}

// link adds a link from node a to node b and its reverse, as KFD lists both.
func link(nodes []fixNode, a, b uint32, typ uint64) {
	weight, bw := map[uint64]uint64{1: 21, LinkPCIe: 20, LinkXGMI: 15}[typ], map[uint64]uint64{1: 0, LinkPCIe: 0, LinkXGMI: 64000}[typ]
	for _, d := range [][2]uint32{{a, b}, {b, a}} {
		nodes[d[0]].links = append(nodes[d[0]].links, ordered(linkOrder, map[string]uint64{
			"type": typ, "node_from": uint64(d[0]), "node_to": uint64(d[1]), "weight": weight,
			"min_bandwidth": bw, "max_bandwidth": bw, "flags": 1,
		}))
	}
}

func fixtures() map[string][]fixNode {
	const gib = 1 << 30
	one := []fixNode{cpuNode(0, 64, 256*gib), gpuNode(mi210, 53820, 0xc3, 128, 0)}
	link(one, 0, 1, LinkPCIe)

	pcie := []fixNode{
		cpuNode(0, 32, 128*gib), cpuNode(1, 32, 128*gib),
		gpuNode(mi100, 18346, 0x23, 128, 0), gpuNode(mi100, 29493, 0x26, 129, 0),
		gpuNode(mi100, 51142, 0xa3, 130, 0), gpuNode(mi100, 63541, 0xa6, 131, 0),
	}
	link(pcie, 0, 1, 1)
	for g, cpu := range []uint32{0, 0, 1, 1} {
		link(pcie, uint32(g)+2, cpu, LinkPCIe)
	}

	const hive = 0x9b1f_6c2e_4d83_a511
	xgmi := []fixNode{
		cpuNode(0, 32, 128*gib), cpuNode(1, 32, 128*gib),
		gpuNode(mi100, 7126, 0x23, 128, hive), gpuNode(mi100, 19865, 0x26, 129, hive),
		gpuNode(mi100, 40211, 0xa3, 130, hive), gpuNode(mi100, 61437, 0xa6, 131, hive),
	}
	link(xgmi, 0, 1, 1)
	for g, cpu := range []uint32{0, 0, 1, 1} {
		link(xgmi, uint32(g)+2, cpu, LinkPCIe)
	}
	for a := uint32(2); a < 6; a++ {
		for b := a + 1; b < 6; b++ {
			link(xgmi, a, b, LinkXGMI)
		}
	}
	return map[string][]fixNode{"mi210": one, "pcie4-numa2": pcie, "xgmi-hive4": xgmi}
}

func render(props []prop) []byte {
	var b bytes.Buffer
	for _, p := range props {
		fmt.Fprintf(&b, "%s %d\n", p.key, p.val)
	}
	return b.Bytes()
}

// writeTree writes nodes as a KFD topology under root.
func writeTree(t *testing.T, root string, nodes []fixNode) {
	t.Helper()
	files := map[string][]byte{}
	for id, n := range nodes {
		dir := filepath.Join("nodes", fmt.Sprint(id))
		props := append([]prop(nil), n.props...)
		for i := range props {
			if props[i].key == "io_links_count" {
				props[i].val = uint64(len(n.links))
			}
		}
		files[filepath.Join(dir, "gpu_id")] = []byte(fmt.Sprintf("%d\n", n.gpuID))
		files[filepath.Join(dir, "name")] = []byte(n.name + "\n")
		files[filepath.Join(dir, "properties")] = render(props)
		for sub, list := range map[string][][]prop{"mem_banks": n.banks, "caches": n.caches, "io_links": n.links} {
			for i, p := range list {
				files[filepath.Join(dir, sub, fmt.Sprint(i), "properties")] = render(p)
			}
		}
	}
	for name, data := range files {
		path := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func readTree(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		out[strings.TrimPrefix(path, root)] = string(data)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestFixturesUpToDate proves the checked-in trees are what the generator writes, so a
// change to either is caught; go test -run Fixtures -update rewrites them.
func TestFixturesUpToDate(t *testing.T) {
	for name, nodes := range fixtures() {
		dst := filepath.Join("testdata", name)
		if *update {
			if err := os.RemoveAll(dst); err != nil {
				t.Fatal(err)
			}
			writeTree(t, dst, nodes)
		}
		tmp := t.TempDir()
		writeTree(t, tmp, nodes)
		want, got := readTree(t, tmp), readTree(t, dst)
		if len(want) != len(got) {
			t.Errorf("%s: %d files checked in, generator writes %d (run with -update)", name, len(got), len(want))
		}
		for f, w := range want {
			if got[f] != w {
				t.Errorf("%s%s differs from the generator (run with -update)", dst, f)
			}
		}
	}
}
