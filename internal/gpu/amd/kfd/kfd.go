// Package kfd reads the AMD KFD driver's sysfs topology, the same view of the host's
// CPUs and GPUs that ROCm and AMD's CRIU plugin use to decide where a checkpoint's GPU
// state can be restored.
package kfd

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// DefaultRoot is where the KFD driver publishes its topology.
const DefaultRoot = "/sys/class/kfd/kfd/topology"

// IO link types from the CRAT table, as KFD reports them in io_links/*/properties.
const (
	LinkPCIe = 2
	LinkXGMI = 11
)

// Node is one KFD topology node: a CPU NUMA node (GPUID 0) or a GPU.
type Node struct {
	ID         uint32            // the node directory's number
	GPUID      uint32            // KFD's gpu_id; 0 for CPU nodes
	Name       string            // e.g. "gfx90a"; empty for CPU nodes on most kernels
	Properties map[string]uint64 // every line of the node's properties file

	SIMDCount        uint32
	CPUCoresCount    uint32
	MemBanksCount    uint32
	CachesCount      uint32
	IOLinksCount     uint32
	VendorID         uint32
	DeviceID         uint32
	LocationID       uint32
	Domain           uint32
	DRMRenderMinor   uint32
	HiveID           uint64 // GPUs of one xGMI hive share a nonzero hive_id
	GFXTargetVersion uint32
	FWVersion        uint32
	SDMAFWVersion    uint32
	NumGWS           uint32
	Capability       uint32
	LocalMemSize     uint64 // sum of the mem banks' size_in_bytes (KFD reports local_mem_size as 0)
	NUMANode         int    // the CPU node the GPU hangs off, or the CPU node itself; -1 if unknown

	MemBanks []MemBank
	Caches   []Cache
	IOLinks  []IOLink
}

// IsGPU reports whether n is a GPU node; KFD gives CPU nodes gpu_id 0.
func (n Node) IsGPU() bool { return n.GPUID != 0 }

// MemBank is one mem_banks entry of a node.
type MemBank struct {
	HeapType    uint32
	SizeInBytes uint64
	Properties  map[string]uint64
}

// Cache is one caches entry of a node.
type Cache struct {
	Level      uint32
	Size       uint32 // KiB
	Type       uint32
	Properties map[string]uint64
}

// IOLink is one io_links entry: a link from this node to another.
type IOLink struct {
	Type       uint32 // LinkPCIe, LinkXGMI or another CRAT link type
	NodeFrom   uint32
	NodeTo     uint32
	Weight     uint32
	Properties map[string]uint64
}

// GPUs returns the GPU nodes of nodes, in order.
func GPUs(nodes []Node) []Node {
	var out []Node
	for _, n := range nodes {
		if n.IsGPU() {
			out = append(out, n)
		}
	}
	return out
}

// Read reads every node under root (DefaultRoot on a live host), sorted by node ID, and
// fills in each node's NUMA node from its io_links.
func Read(root string) ([]Node, error) {
	dir := filepath.Join(root, "nodes")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read KFD topology: %w", err)
	}
	var nodes []Node
	for _, e := range entries {
		id, err := strconv.ParseUint(e.Name(), 10, 32)
		if err != nil || !e.IsDir() {
			continue // not a node directory
		}
		n, err := readNode(filepath.Join(dir, e.Name()), uint32(id))
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, n)
	}
	if len(nodes) == 0 {
		return nil, fmt.Errorf("read KFD topology: no nodes under %s", dir)
	}
	slices.SortFunc(nodes, func(a, b Node) int { return int(a.ID) - int(b.ID) })
	SetNUMANodes(nodes)
	return nodes, nil
}

// SetNUMANodes sets NUMANode on every node that lacks one: a CPU node is its own NUMA
// node, and a GPU belongs to the first CPU node one of its io_links reaches.
func SetNUMANodes(nodes []Node) {
	cpu := map[uint32]bool{}
	for _, n := range nodes {
		if !n.IsGPU() {
			cpu[n.ID] = true
		}
	}
	for i := range nodes {
		n := &nodes[i]
		if n.NUMANode >= 0 {
			continue
		}
		if !n.IsGPU() {
			n.NUMANode = int(n.ID)
			continue
		}
		for _, l := range n.IOLinks {
			if cpu[l.NodeTo] {
				n.NUMANode = int(l.NodeTo)
				break
			}
		}
	}
}

func readNode(dir string, id uint32) (Node, error) {
	n := Node{ID: id, NUMANode: -1}
	var err error
	if n.GPUID, err = readGPUID(filepath.Join(dir, "gpu_id")); err != nil {
		return Node{}, err
	}
	name, err := os.ReadFile(filepath.Join(dir, "name"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return Node{}, fmt.Errorf("read KFD node %d name: %w", id, err)
	}
	n.Name = strings.TrimSpace(string(name))
	if n.Properties, err = readProperties(filepath.Join(dir, "properties")); err != nil {
		return Node{}, err
	}
	if err := n.setFields(filepath.Join(dir, "properties")); err != nil {
		return Node{}, err
	}
	if err := readEntries(filepath.Join(dir, "mem_banks"), func(file string, p map[string]uint64) error {
		n.MemBanks = append(n.MemBanks, MemBank{HeapType: uint32(p["heap_type"]), SizeInBytes: p["size_in_bytes"], Properties: p})
		return nil
	}); err != nil {
		return Node{}, err
	}
	for _, b := range n.MemBanks {
		n.LocalMemSize += b.SizeInBytes
	}
	if err := readEntries(filepath.Join(dir, "caches"), func(file string, p map[string]uint64) error {
		n.Caches = append(n.Caches, Cache{Level: uint32(p["level"]), Size: uint32(p["size"]), Type: uint32(p["type"]), Properties: p})
		return nil
	}); err != nil {
		return Node{}, err
	}
	err = readEntries(filepath.Join(dir, "io_links"), func(file string, p map[string]uint64) error {
		l := IOLink{Type: uint32(p["type"]), NodeFrom: uint32(p["node_from"]), NodeTo: uint32(p["node_to"]), Weight: uint32(p["weight"]), Properties: p}
		if l.NodeFrom != id {
			return fmt.Errorf("%s: node_from %d, but the link is under node %d", file, l.NodeFrom, id)
		}
		n.IOLinks = append(n.IOLinks, l)
		return nil
	})
	return n, err
}

// setFields copies the properties that restore checks and mapping use into typed fields.
// The numa_node (or numa) property, where a kernel provides one, wins over io_links.
func (n *Node) setFields(file string) error {
	fields32 := []struct {
		key string
		dst *uint32
	}{
		{"simd_count", &n.SIMDCount}, {"cpu_cores_count", &n.CPUCoresCount},
		{"mem_banks_count", &n.MemBanksCount}, {"caches_count", &n.CachesCount},
		{"io_links_count", &n.IOLinksCount}, {"vendor_id", &n.VendorID},
		{"device_id", &n.DeviceID}, {"location_id", &n.LocationID}, {"domain", &n.Domain},
		{"drm_render_minor", &n.DRMRenderMinor}, {"gfx_target_version", &n.GFXTargetVersion},
		{"fw_version", &n.FWVersion}, {"sdma_fw_version", &n.SDMAFWVersion},
		{"num_gws", &n.NumGWS}, {"capability", &n.Capability},
	}
	for _, f := range fields32 {
		v := n.Properties[f.key]
		if v > 1<<32-1 {
			return fmt.Errorf("%s: %s %d does not fit in 32 bits", file, f.key, v)
		}
		*f.dst = uint32(v)
	}
	n.HiveID = n.Properties["hive_id"]
	for _, key := range []string{"numa_node", "numa"} {
		// sysfs prints the kernel's -1 (no node) as 2^64-1; no value past an int32 is a node.
		if v, ok := n.Properties[key]; ok {
			if v <= math.MaxInt32 {
				n.NUMANode = int(v)
			}
			break
		}
	}
	return nil
}

// readEntries calls add with the parsed properties file of each numbered subdirectory of
// dir, in numeric order. A missing dir has no entries.
func readEntries(dir string, add func(file string, p map[string]uint64) error) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read KFD topology: %w", err)
	}
	var ids []int
	for _, e := range entries {
		if id, err := strconv.Atoi(e.Name()); err == nil && e.IsDir() {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		file := filepath.Join(dir, strconv.Itoa(id), "properties")
		p, err := readProperties(file)
		if err != nil {
			return err
		}
		if err := add(file, p); err != nil {
			return err
		}
	}
	return nil
}

// readProperties parses a KFD properties file: one "name value" pair a line, values
// unsigned decimal integers.
func readProperties(file string) (map[string]uint64, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read KFD topology: %w", err)
	}
	p := map[string]uint64{}
	for i, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 2 {
			return nil, fmt.Errorf("%s:%d: want \"name value\", got %q", file, i+1, line)
		}
		v, err := strconv.ParseUint(fields[1], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %s: %w", file, i+1, fields[0], err)
		}
		if _, dup := p[fields[0]]; dup {
			return nil, fmt.Errorf("%s:%d: %s given twice", file, i+1, fields[0])
		}
		p[fields[0]] = v
	}
	return p, nil
}

func readGPUID(file string) (uint32, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return 0, fmt.Errorf("read KFD topology: %w", err)
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 32)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", file, err)
	}
	return uint32(v), nil
}
