package kfd

import (
	"bytes"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpucr/gpucr/internal/fuzzcheck"
)

// renderMap writes p as a properties file, keys sorted.
func renderMap(p map[string]uint64) []byte {
	var b bytes.Buffer
	for _, k := range slices.Sorted(maps.Keys(p)) {
		fmt.Fprintf(&b, "%s %d\n", k, p[k])
	}
	return b.Bytes()
}

// A properties file is "name value" lines. readProperties returns each name once with its
// unsigned value, or an error; what it returns, written out again, reads back the same.
func FuzzReadProperties(f *testing.F) {
	for _, nodes := range fixtures() {
		for _, n := range nodes {
			f.Add(render(n.props))
			for _, l := range n.links {
				f.Add(render(l))
			}
		}
	}
	f.Add([]byte("a 1\na 2\n"))
	f.Add([]byte("a -1\n"))
	f.Add([]byte("a 18446744073709551616\n"))
	f.Add([]byte("a 1 2\n"))
	f.Add([]byte("\n\n  \t\n"))
	f.Add([]byte("a\t0x10\r\n"))
	f.Add([]byte{})
	file := filepath.Join(f.TempDir(), "properties")
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(file, data, 0o600); err != nil {
			t.Fatal(err)
		}
		var p map[string]uint64
		var err error
		if n := fuzzcheck.Allocated(func() { p, err = readProperties(file) }); n > fuzzcheck.AllocSlack+uint64(64*len(data)) {
			t.Fatalf("readProperties allocated %d bytes for %d bytes", n, len(data))
		}
		if err != nil {
			return
		}
		for k := range p {
			if k == "" || strings.ContainsFunc(k, func(r rune) bool { return strings.TrimSpace(string(r)) == "" }) {
				t.Fatalf("property name %q", k)
			}
		}
		if err := os.WriteFile(file, renderMap(p), 0o600); err != nil {
			t.Fatal(err)
		}
		back, err := readProperties(file)
		if err != nil || !maps.Equal(back, p) {
			t.Fatalf("read back %v, %v; wrote %v", back, err, p)
		}
	})
}

// A topology is read on the host, but AMD's plugin images carry the same properties, and a
// driver can list anything. Read returns nodes in ID order whose typed fields are their
// properties' values, GPUs and CPUs told apart by gpu_id, links from their own node, VRAM
// summed over the banks, and a NUMA node that is a CPU node, the numa property, or -1.
func FuzzRead(f *testing.F) {
	mi210 := fixtures()["mi210"]
	cpu, gpu := mi210[0], mi210[1]
	f.Add([]byte("53820\n"), render(gpu.props), render(gpu.links[0]), render(gpu.banks[0]), render(gpu.caches[0]))
	f.Add([]byte("0\n"), render(gpu.props), render(gpu.links[0]), render(gpu.banks[0]), render(gpu.caches[0]))
	f.Add([]byte("53820"), []byte("numa_node 7\nsimd_count 4294967296\n"), []byte("type 2\nnode_from 2\n"), []byte{}, []byte{})
	f.Add([]byte("53820"), []byte("numa 18446744073709551615\n"), []byte("type 11\nnode_from 1\nnode_to 0\n"),
		[]byte("size_in_bytes 18446744073709551615\n"), []byte("level 4294967297\n"))
	f.Add([]byte("-1"), []byte{}, []byte{}, []byte{}, []byte{})
	for _, numa := range []string{"2147483648", "9223372036854775808"} {
		f.Add([]byte("53820"), []byte("numa_node "+numa+"\nnuma 1\n"), render(gpu.links[0]), []byte{}, []byte{})
	}
	root := f.TempDir()
	node0 := filepath.Join(root, "nodes", "0")
	node1 := filepath.Join(root, "nodes", "1")
	for _, d := range []string{"io_links/0", "mem_banks/0"} {
		if err := os.MkdirAll(filepath.Join(node0, d), 0o700); err != nil {
			f.Fatal(err)
		}
	}
	for _, d := range []string{"io_links/0", "mem_banks/0", "caches/0"} {
		if err := os.MkdirAll(filepath.Join(node1, d), 0o700); err != nil {
			f.Fatal(err)
		}
	}
	for name, data := range map[string][]byte{
		"gpu_id": []byte("0\n"), "properties": render(cpu.props), "io_links/0/properties": render(cpu.links[0]),
		"mem_banks/0/properties": render(cpu.banks[0]),
	} {
		if err := os.WriteFile(filepath.Join(node0, name), data, 0o600); err != nil {
			f.Fatal(err)
		}
	}
	f.Fuzz(func(t *testing.T, gpuID, props, link, bank, cache []byte) {
		size := 0
		for name, data := range map[string][]byte{
			"gpu_id": gpuID, "properties": props, "io_links/0/properties": link,
			"mem_banks/0/properties": bank, "caches/0/properties": cache,
		} {
			if err := os.WriteFile(filepath.Join(node1, name), data, 0o600); err != nil {
				t.Fatal(err)
			}
			size += len(data)
		}
		var nodes []Node
		var err error
		if n := fuzzcheck.Allocated(func() { nodes, err = Read(root) }); n > fuzzcheck.AllocSlack+uint64(64*size) {
			t.Fatalf("Read allocated %d bytes for %d bytes of properties", n, size)
		}
		if err != nil {
			return
		}
		if len(nodes) != 2 || nodes[0].ID != 0 || nodes[1].ID != 1 || nodes[0].IsGPU() {
			t.Fatalf("nodes %+v", nodes)
		}
		for _, n := range nodes {
			for key, v := range map[string]uint64{
				"simd_count": uint64(n.SIMDCount), "cpu_cores_count": uint64(n.CPUCoresCount),
				"caches_count": uint64(n.CachesCount), "vendor_id": uint64(n.VendorID), "device_id": uint64(n.DeviceID),
				"fw_version": uint64(n.FWVersion), "sdma_fw_version": uint64(n.SDMAFWVersion), "num_gws": uint64(n.NumGWS),
				"capability": uint64(n.Capability), "hive_id": n.HiveID, "drm_render_minor": uint64(n.DRMRenderMinor),
			} {
				if v != n.Properties[key] {
					t.Fatalf("node %d: %s is %d, its property %d", n.ID, key, v, n.Properties[key])
				}
			}
			var vram uint64
			for _, b := range n.MemBanks {
				vram += b.SizeInBytes
			}
			if vram != n.LocalMemSize {
				t.Fatalf("node %d: VRAM %d, its banks %d", n.ID, n.LocalMemSize, vram)
			}
			for _, l := range n.IOLinks {
				if l.NodeFrom != n.ID {
					t.Fatalf("node %d has a link from %d", n.ID, l.NodeFrom)
				}
			}
			numa, set := n.Properties["numa_node"]
			if !set {
				numa, set = n.Properties["numa"]
			}
			// A value past an int32 (sysfs prints -1 as 2^64-1) is no NUMA node: the io_links
			// decide, as they do without the property, and a negative NUMANode is unknown to
			// every reader.
			switch {
			case set && numa <= math.MaxInt32:
				if n.NUMANode != int(numa) {
					t.Fatalf("node %d: NUMA node %d, its property %d", n.ID, n.NUMANode, numa)
				}
			case !n.IsGPU():
				if n.NUMANode != int(n.ID) {
					t.Fatalf("CPU node %d: NUMA node %d", n.ID, n.NUMANode)
				}
			case n.NUMANode >= 0 && (n.NUMANode >= len(nodes) || nodes[n.NUMANode].IsGPU()):
				t.Fatalf("GPU node %d: NUMA node %d is not a CPU node", n.ID, n.NUMANode)
			}
		}
		if gpus := GPUs(nodes); nodes[1].IsGPU() != (len(gpus) == 1) {
			t.Fatalf("GPUs(%+v) = %+v", nodes, gpus)
		}
	})
}
