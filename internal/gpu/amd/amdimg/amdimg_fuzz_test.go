package amdimg

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/gpucr/gpucr/internal/fuzzcheck"
	"github.com/gpucr/gpucr/internal/gpu/amd/kfd"
	"github.com/gpucr/gpucr/internal/gpu/amd/placement"
)

// The plugin's images come with the checkpoint. Read refuses a file whose size header does
// not match its length, or whose body is not the message; what it accepts, written again
// with Write, reads back equal and writes the same bytes twice. The device entries become
// topology nodes with their links and NUMA nodes in order, and mapping them onto a host
// gives each image GPU its own host GPU, one that passes the checks.
func FuzzRead(f *testing.F) {
	golden, err := filepath.Glob(filepath.Join("testdata", "*.img"))
	if err != nil || len(golden) == 0 {
		f.Fatalf("no golden images: %v", err)
	}
	for _, g := range golden {
		b, err := os.ReadFile(g)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)-1])
		f.Add(append(bytes.Clone(b), 0))
		f.Add(binary.LittleEndian.AppendUint64(nil, 1<<40))
	}
	f.Add([]byte{})
	f.Add([]byte{1, 2, 3})
	host, err := kfd.Read(filepath.Join("..", "kfd", "testdata", "pcie4-numa2"))
	if err != nil {
		f.Fatal(err)
	}
	dir := f.TempDir()
	path := filepath.Join(dir, "amdgpu-kfd-1.img")
	again := filepath.Join(dir, "again.img")
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		for _, m := range []proto.Message{&CriuKfd{}, &CriuRenderNode{}} {
			var err error
			if n := fuzzcheck.Allocated(func() { err = Read(path, m) }); n > fuzzcheck.AllocSlack+uint64(256*len(data)) {
				t.Fatalf("Read allocated %d bytes for a %d-byte image", n, len(data))
			}
			if err != nil {
				continue
			}
			if len(data) < sizeLen || binary.LittleEndian.Uint64(data) != uint64(len(data)-sizeLen) {
				t.Fatalf("accepted %d bytes whose header says otherwise", len(data))
			}
			if err := Write(again, m); err != nil {
				t.Fatalf("Write of what Read accepted: %v", err)
			}
			b1, err := os.ReadFile(again)
			if err != nil {
				t.Fatal(err)
			}
			back := m.ProtoReflect().New().Interface()
			if err := Read(again, back); err != nil || !proto.Equal(back, m) {
				t.Fatalf("read back %v, %v; wrote %v", back, err, m)
			}
			if err := Write(again, back); err != nil {
				t.Fatal(err)
			}
			if b2, err := os.ReadFile(again); err != nil || !bytes.Equal(b1, b2) {
				t.Fatalf("one message, written twice, gave different files (%v)", err)
			}
		}

		var k CriuKfd
		if Read(path, &k) != nil {
			return
		}
		nodes := Nodes(&k)
		if len(nodes) != len(k.GetDeviceEntries()) {
			t.Fatalf("%d device entries became %d nodes", len(k.GetDeviceEntries()), len(nodes))
		}
		cpus := map[uint32]bool{}
		for _, n := range nodes {
			if !n.IsGPU() {
				cpus[n.ID] = true
			}
		}
		for i, n := range nodes {
			d := k.GetDeviceEntries()[i]
			if n.ID != d.GetNodeId() || n.GPUID != d.GetGpuId() || len(n.IOLinks) != len(d.GetIolinks()) {
				t.Fatalf("node %+v from entry %v", n, d)
			}
			for _, l := range n.IOLinks {
				if l.NodeFrom != n.ID {
					t.Fatalf("node %d has a link from %d", n.ID, l.NodeFrom)
				}
			}
			switch {
			case !n.IsGPU() && n.NUMANode != int(n.ID):
				t.Fatalf("CPU node %d in NUMA node %d", n.ID, n.NUMANode)
			case n.IsGPU() && n.NUMANode != -1 && !cpus[uint32(n.NUMANode)]:
				t.Fatalf("GPU node %d in NUMA node %d, not a CPU node", n.ID, n.NUMANode)
			}
		}
		p := summarizeKFD("amdgpu-kfd-1.img", &k)
		count := 0
		for _, b := range p.Buffers {
			count += b.Count
		}
		if count != len(k.GetBoEntries()) {
			t.Fatalf("%d buffers summarized as %d", len(k.GetBoEntries()), count)
		}

		mapping, err := placement.Map(nodes, host, nil)
		if err != nil {
			return
		}
		hostGPUs := map[uint32]bool{}
		for _, n := range kfd.GPUs(host) {
			hostGPUs[n.GPUID] = true
		}
		onto := map[uint32]uint32{}
		for _, n := range kfd.GPUs(nodes) {
			h, ok := mapping[n.GPUID]
			if !ok || !hostGPUs[h] {
				t.Fatalf("image GPU %d mapped to %d, %v: not a host GPU", n.GPUID, h, ok)
			}
			if prev, dup := onto[h]; dup && prev != n.GPUID {
				t.Fatalf("image GPUs %d and %d both on host GPU %d", prev, n.GPUID, h)
			}
			onto[h] = n.GPUID
		}
		if len(mapping) != len(onto) {
			t.Fatalf("mapping %v", mapping)
		}
	})
}
