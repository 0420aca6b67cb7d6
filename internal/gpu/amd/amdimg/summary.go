package amdimg

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Summary is what an image directory holds of AMD GPU state, for `gpucr inspect`.
type Summary struct {
	Processes   []Process    `json:"processes"`   // one per amdgpu-kfd image
	RenderNodes []RenderNode `json:"renderNodes"` // one per amdgpu-renderD image
}

// Process is one process's /dev/kfd state.
type Process struct {
	File          string        `json:"file"`
	PID           uint32        `json:"pid"`
	GPUs          []GPU         `json:"gpus"`
	Buffers       []BufferGroup `json:"buffers"`
	SharedMemSize uint64        `json:"sharedMemSize"`
}

// GPU is one GPU device entry of a kfd image, as the checkpointed host described it.
type GPU struct {
	GPUID      uint32            `json:"gpuId"`
	NodeID     uint32            `json:"nodeId"`
	Properties map[string]uint64 `json:"properties"` // every numeric field by its proto name
}

// BufferGroup counts the buffer objects of one GPU, memory domain and size: the shape of
// a checkpoint's GPU memory without listing thousands of buffers.
type BufferGroup struct {
	GPUID  uint32 `json:"gpuId"`
	Domain string `json:"domain"` // VRAM, GTT, USERPTR, DOORBELL, MMIO_REMAP, or the raw flags
	Size   uint64 `json:"size"`   // bytes of each buffer
	Count  int    `json:"count"`
	Bytes  uint64 `json:"bytes"` // Size * Count
}

// RenderNode is one /dev/dri/renderD* file the processes had open.
type RenderNode struct {
	File  string `json:"file"`
	ID    int    `json:"id"` // CRIU's file id
	GPUID uint32 `json:"gpuId"`
}

// Allocation domains, the low bits of KFD_IOC_ALLOC_MEM_FLAGS_* in a buffer's alloc_flags.
var domains = []struct {
	bit  uint32
	name string
}{{1 << 0, "VRAM"}, {1 << 1, "GTT"}, {1 << 2, "USERPTR"}, {1 << 3, "DOORBELL"}, {1 << 4, "MMIO_REMAP"}}

// Domain names the memory domain of a buffer's alloc_flags.
func Domain(allocFlags uint32) string {
	for _, d := range domains {
		if allocFlags&d.bit != 0 {
			return d.name
		}
	}
	return fmt.Sprintf("flags %#x", allocFlags)
}

// Summarize reads every AMD plugin image in dir. A directory without any (a CPU-only or
// NVIDIA checkpoint) gives an empty Summary.
func Summarize(dir string) (*Summary, error) {
	s := &Summary{}
	kfdIDs, err := imageIDs(dir, KFDFilePattern)
	if err != nil {
		return nil, err
	}
	for _, id := range kfdIDs {
		name := fmt.Sprintf(KFDFilePattern, id)
		var k CriuKfd
		if err := Read(filepath.Join(dir, name), &k); err != nil {
			return nil, err
		}
		s.Processes = append(s.Processes, summarizeKFD(name, &k))
	}
	renderIDs, err := imageIDs(dir, RenderFilePattern)
	if err != nil {
		return nil, err
	}
	for _, id := range renderIDs {
		name := fmt.Sprintf(RenderFilePattern, id)
		var r CriuRenderNode
		if err := Read(filepath.Join(dir, name), &r); err != nil {
			return nil, err
		}
		s.RenderNodes = append(s.RenderNodes, RenderNode{File: name, ID: id, GPUID: r.GetGpuId()})
	}
	return s, nil
}

func summarizeKFD(name string, k *CriuKfd) Process {
	p := Process{File: name, PID: k.GetPid(), SharedMemSize: k.GetSharedMemSize()}
	for _, d := range k.GetDeviceEntries() {
		if d.GetGpuId() != 0 {
			p.GPUs = append(p.GPUs, GPU{GPUID: d.GetGpuId(), NodeID: d.GetNodeId(), Properties: properties(d)})
		}
	}
	type key struct {
		gpu    uint32
		domain string
		size   uint64
	}
	groups := map[key]int{}
	for _, b := range k.GetBoEntries() {
		groups[key{b.GetGpuId(), Domain(b.GetAllocFlags()), b.GetSize()}]++
	}
	for k, n := range groups {
		p.Buffers = append(p.Buffers, BufferGroup{GPUID: k.gpu, Domain: k.domain, Size: k.size, Count: n, Bytes: k.size * uint64(n)})
	}
	slices.SortFunc(p.Buffers, func(a, b BufferGroup) int {
		return cmp.Or(cmp.Compare(a.GPUID, b.GPUID), strings.Compare(a.Domain, b.Domain), cmp.Compare(b.Size, a.Size))
	})
	return p
}

// imageIDs lists, in increasing order, the ids of the files in dir that pattern names.
func imageIDs(dir, pattern string) ([]int, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list AMD GPU images: %w", err)
	}
	var ids []int
	for _, e := range entries {
		var id int
		if _, err := fmt.Sscanf(e.Name(), pattern, &id); err != nil || fmt.Sprintf(pattern, id) != e.Name() {
			continue // not one of the plugin's names, e.g. amdgpu-kfd-old.img
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}
