package amdimg

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/gpucr/gpucr/internal/fuzzcheck"
	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/gpu/amd/kfd"
	"github.com/gpucr/gpucr/internal/gpu/amd/placement"
	"github.com/gpucr/gpucr/internal/protobound"
)

var update = flag.Bool("update", false, "rewrite the golden images in testdata/")

// KFD_IOC_ALLOC_MEM_FLAGS_* bits the sample buffers use.
const (
	flagVRAM, flagGTT, flagUserptr, flagDoorbell, flagMMIO = 1 << 0, 1 << 1, 1 << 2, 1 << 3, 1 << 4
	flagWritable, flagExecutable, flagPublic               = 1 << 31, 1 << 30, 1 << 29
)

// sample is the kfd image a process on the pcie4-numa2 fixture host would leave: every
// topology node as a device entry (the sysfs property names are the proto field names),
// and buffers on two of its GPUs.
func sample(t *testing.T) *CriuKfd {
	t.Helper()
	nodes, err := kfd.Read(filepath.Join("..", "kfd", "testdata", "pcie4-numa2"))
	if err != nil {
		t.Fatal(err)
	}
	k := &CriuKfd{
		Pid: proto.Uint32(4242), NumOfObjects: proto.Uint32(0), SharedMemSize: proto.Uint64(4096),
		SharedMemMagic: proto.Uint32(0x4b464453), PrivData: []byte{1, 2, 3, 4},
	}
	for _, n := range nodes {
		d := &KfdDeviceEntry{}
		fields := d.ProtoReflect().Descriptor().Fields()
		for i := range fields.Len() {
			f := fields.Get(i)
			if f.Cardinality() != protoreflect.Repeated {
				d.ProtoReflect().Set(f, scalar(f, n.Properties[string(f.Name())]))
			}
		}
		d.NodeId, d.GpuId = proto.Uint32(n.ID), proto.Uint32(n.GPUID)
		if n.IsGPU() {
			d.VramSize, d.VramPublic = proto.Uint64(n.LocalMemSize), proto.Uint32(1)
			k.NumOfGpus = proto.Uint32(k.GetNumOfGpus() + 1)
		} else {
			k.NumOfCpus = proto.Uint32(k.GetNumOfCpus() + 1)
		}
		for _, l := range n.IOLinks {
			d.Iolinks = append(d.Iolinks, &DevIolink{Type: proto.Uint32(l.Type), NodeToId: proto.Uint32(l.NodeTo)})
		}
		k.DeviceEntries = append(k.DeviceEntries, d)
	}
	bo := func(gpu uint32, addr, size uint64, flags uint32) {
		k.BoEntries = append(k.BoEntries, &KfdBoEntry{
			Addr: proto.Uint64(addr), Size: proto.Uint64(size), Offset: proto.Uint64(addr >> 12),
			AllocFlags: proto.Uint32(flags), GpuId: proto.Uint32(gpu),
		})
	}
	vram := uint32(flagVRAM | flagWritable | flagExecutable | flagPublic)
	for i := range uint64(3) {
		bo(18346, 0x7f0000000000+i<<21, 2<<20, vram)
	}
	bo(18346, 0x7f1000000000, 1<<30, vram)
	bo(18346, 0x7f2000000000, 4096, flagGTT|flagWritable)
	bo(18346, 0x7f2000001000, 4096, flagGTT|flagWritable)
	bo(18346, 0x7f3000000000, 64<<10, flagUserptr|flagWritable)
	bo(18346, 0x7f4000000000, 8192, flagDoorbell|flagWritable)
	bo(18346, 0x7f5000000000, 4096, flagMMIO|flagWritable)
	bo(51142, 0x7f6000000000, 2<<20, vram)
	bo(51142, 0x7f6000200000, 2<<20, vram)
	bo(51142, 0x7f7000000000, 4096, flagWritable) // no domain bit
	k.NumOfBos = proto.Uint64(uint64(len(k.BoEntries)))
	return k
}

func scalar(f protoreflect.FieldDescriptor, v uint64) protoreflect.Value {
	if f.Kind() == protoreflect.Uint64Kind {
		return protoreflect.ValueOfUint64(v)
	}
	return protoreflect.ValueOfUint32(uint32(v))
}

func renderNodes() map[string]*CriuRenderNode {
	return map[string]*CriuRenderNode{
		fmt.Sprintf(RenderFilePattern, 9):  {GpuId: proto.Uint32(18346)},
		fmt.Sprintf(RenderFilePattern, 11): {GpuId: proto.Uint32(51142)},
	}
}

func goldenFiles(t *testing.T) map[string]proto.Message {
	files := map[string]proto.Message{fmt.Sprintf(KFDFilePattern, 7): sample(t)}
	for name, m := range renderNodes() {
		files[name] = m
	}
	return files
}

// TestGolden proves Write produces the checked-in bytes (8-byte little-endian length, then
// the message) and Read gives back the message; go test -run Golden -update rewrites them.
func TestGolden(t *testing.T) {
	tmp := t.TempDir()
	for name, m := range goldenFiles(t) {
		golden := filepath.Join("testdata", name)
		if *update {
			if err := Write(golden, m); err != nil {
				t.Fatal(err)
			}
		}
		if err := Write(filepath.Join(tmp, name), m); err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(golden)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(tmp, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: Write gives %d bytes that differ from the golden %d (run with -update)", name, len(got), len(want))
		}
		if n := binary.LittleEndian.Uint64(want); n != uint64(len(want)-8) {
			t.Errorf("%s: header %d, body %d bytes", name, n, len(want)-8)
		}
		back := m.ProtoReflect().New().Interface()
		if err := Read(golden, back); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(back, m) {
			t.Errorf("%s: read back %v, want %v", name, back, m)
		}
	}
}

// TestReadErrors proves damaged images are refused with the file named, truncation
// matching io.ErrUnexpectedEOF.
func TestReadErrors(t *testing.T) {
	body, err := proto.Marshal(&CriuRenderNode{GpuId: proto.Uint32(5)})
	if err != nil {
		t.Fatal(err)
	}
	header := func(n int) []byte { return binary.LittleEndian.AppendUint64(nil, uint64(n)) }
	partial, err := proto.MarshalOptions{AllowPartial: true}.Marshal(&CriuRenderNode{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		data  []byte
		want  string
		trunc bool
	}{
		{"empty", nil, "0 bytes, shorter than the 8-byte size header", true},
		{"short header", []byte{1, 0, 0}, "3 bytes, shorter", true},
		{"truncated body", append(header(len(body)+1), body...), fmt.Sprintf("header says %d bytes, %d follow", len(body)+1, len(body)), true},
		{"trailing bytes", append(append(header(len(body)), body...), 0), fmt.Sprintf("header says %d bytes, %d follow", len(body), len(body)+1), false},
		// CRIU's own framing: two 4-byte magics, a 4-byte entry size, the entry.
		{"CRIU framing", append([]byte{0x19, 0x43, 0x56, 0x54, 0x5c, 0x35, 0x11, 0x58, byte(len(body)), 0, 0, 0}, body...), "header says", true},
		{"not protobuf", append(header(2), 0xff, 0xff), "cannot parse", false},
		{"missing required field", append(header(len(partial)), partial...), "required field", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "amdgpu-renderD-1.img")
			if err := os.WriteFile(path, tt.data, 0o600); err != nil {
				t.Fatal(err)
			}
			err := Read(path, &CriuRenderNode{})
			if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to name %s and say %q", err, path, tt.want)
			}
			if errors.Is(err, io.ErrUnexpectedEOF) != tt.trunc {
				t.Errorf("errors.Is(err, io.ErrUnexpectedEOF) = %v, want %v", !tt.trunc, tt.trunc)
			}
		})
	}
	if err := Read(filepath.Join(t.TempDir(), "missing.img"), &CriuKfd{}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: err = %v", err)
	}
}

// A file under the plugin's name is read only if it is a regular file of its directory: a
// FIFO planted in an image hung inspect, and a symlink had it read whatever it named
// (hostile test).
func TestReadTakesOnlyARegularFile(t *testing.T) {
	golden, err := filepath.Abs(filepath.Join("testdata", "amdgpu-kfd-7.img"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		plant func(path string) error
	}{
		{"FIFO", func(path string) error { return syscall.Mkfifo(path, 0o600) }},
		{"symlink", func(path string) error { return os.Symlink(golden, path) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "amdgpu-kfd-1.img")
			if err := c.plant(path); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- Read(path, &CriuKfd{}) }()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), path) {
					t.Errorf("Read of a %s: %v, want it refused, named", c.name, err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("Read of a %s waits", c.name)
			}
		})
	}
}

// TestWriteRequiresFields proves Write will not produce an image the plugin's protobuf-c
// decoder would reject for a missing required field.
func TestWriteRequiresFields(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.img")
	err := Write(path, &CriuKfd{Pid: proto.Uint32(1)})
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("err = %v", err)
	}
	if _, statErr := os.Stat(path); !errors.Is(statErr, os.ErrNotExist) {
		t.Errorf("a refused message still left %s", path)
	}
}

// TestSummarize proves the golden directory summarizes into its GPUs, with their image
// properties, and buffers grouped by GPU, domain and size, largest first.
func TestSummarize(t *testing.T) {
	s, err := Summarize("testdata")
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Processes) != 1 {
		t.Fatalf("%d processes, want 1", len(s.Processes))
	}
	p := s.Processes[0]
	if p.File != "amdgpu-kfd-7.img" || p.PID != 4242 || p.SharedMemSize != 4096 {
		t.Errorf("process %s pid %d shm %d", p.File, p.PID, p.SharedMemSize)
	}
	var ids []uint32
	for _, g := range p.GPUs {
		ids = append(ids, g.GPUID)
		for prop, want := range map[string]uint64{"device_id": 0x738c, "vram_size": 34342961152, "fw_version": 59, "simd_count": 480, "gpu_id": uint64(g.GPUID)} {
			if got := g.Properties[prop]; got != want {
				t.Errorf("GPU %d: %s = %d, want %d", g.GPUID, prop, got, want)
			}
		}
	}
	if want := []uint32{18346, 29493, 51142, 63541}; !reflect.DeepEqual(ids, want) {
		t.Errorf("GPUs %v, want %v", ids, want)
	}
	wantBuffers := []BufferGroup{
		{18346, "DOORBELL", 8192, 1, 8192},
		{18346, "GTT", 4096, 2, 8192},
		{18346, "MMIO_REMAP", 4096, 1, 4096},
		{18346, "USERPTR", 65536, 1, 65536},
		{18346, "VRAM", 1 << 30, 1, 1 << 30},
		{18346, "VRAM", 2 << 20, 3, 6 << 20},
		{51142, "VRAM", 2 << 20, 2, 4 << 20},
		{51142, "flags 0x80000000", 4096, 1, 4096},
	}
	if !reflect.DeepEqual(p.Buffers, wantBuffers) {
		t.Errorf("buffers\n%v\nwant\n%v", p.Buffers, wantBuffers)
	}
	wantRender := []RenderNode{{"amdgpu-renderD-9.img", 9, 18346}, {"amdgpu-renderD-11.img", 11, 51142}}
	if !reflect.DeepEqual(s.RenderNodes, wantRender) {
		t.Errorf("render nodes %v, want %v", s.RenderNodes, wantRender)
	}
}

// TestSummarizeDirectories proves a directory without AMD images summarizes empty, files
// not named like the plugin's are left alone, and a missing directory is an error.
func TestSummarizeDirectories(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"pages-1.img", "amdgpu-kfd-old.img", "amdgpu-kfd-+3.img", "amdgpu-pages-7-0001.img"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("not an amdgpu image"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s, err := Summarize(dir)
	if err != nil || len(s.Processes) != 0 || len(s.RenderNodes) != 0 {
		t.Errorf("Summarize = %+v, %v; want empty", s, err)
	}
	if err := Write(filepath.Join(dir, "amdgpu-kfd-3.img"), &CriuRenderNode{GpuId: proto.Uint32(1)}); err != nil {
		t.Fatal(err)
	}
	if _, err := Summarize(dir); err == nil || !strings.Contains(err.Error(), "amdgpu-kfd-3.img") {
		t.Errorf("a render node message in a kfd file: err = %v", err)
	}
	if _, err := Summarize(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing directory: err = %v", err)
	}
}

// TestNodesMapOntoHost proves an image's device entries become topology nodes that restore
// can map: onto the host it came from as identity, and not onto an xGMI hive.
func TestNodesMapOntoHost(t *testing.T) {
	nodes := Nodes(sample(t))
	numa := map[uint32]int{}
	for _, n := range kfd.GPUs(nodes) {
		numa[n.GPUID] = n.NUMANode
		if n.LocalMemSize != 34342961152 || n.DeviceID != 0x738c || n.FWVersion != 59 || n.Properties["num_sdma_engines"] != 2 {
			t.Errorf("GPU %d: %+v", n.GPUID, n)
		}
	}
	if want := map[uint32]int{18346: 0, 29493: 0, 51142: 1, 63541: 1}; !maps.Equal(numa, want) {
		t.Errorf("NUMA nodes %v, want %v", numa, want)
	}
	for _, tt := range []struct {
		host string
		want map[uint32]uint32
	}{
		{"pcie4-numa2", map[uint32]uint32{18346: 18346, 29493: 29493, 51142: 51142, 63541: 63541}},
		{"xgmi-hive4", nil},
	} {
		host, err := kfd.Read(filepath.Join("..", "kfd", "testdata", tt.host))
		if err != nil {
			t.Fatal(err)
		}
		got, err := placement.Map(nodes, host, nil)
		if tt.want == nil {
			if !errors.Is(err, gpu.ErrIncompatible) {
				t.Errorf("%s: Map = %v, %v; want ErrIncompatible", tt.host, got, err)
			}
		} else if err != nil || !maps.Equal(got, tt.want) {
			t.Errorf("%s: Map = %v, %v; want %v", tt.host, got, err, tt.want)
		}
	}
}

// A KFD image may come from a crafted archive: an empty buffer entry is two bytes of the
// file and a struct of memory, and a sparse file reads as gigabytes of zeros.
func TestReadBoundsWhatAFileCosts(t *testing.T) {
	dir := t.TempDir()
	bos := (&CriuKfd{}).ProtoReflect().Descriptor().Fields().ByName("bo_entries").Number()
	var body []byte
	for range maxMessages + 1 {
		body = protowire.AppendBytes(protowire.AppendTag(body, bos, protowire.BytesType), nil)
	}
	bomb := filepath.Join(dir, "amdgpu-kfd-1.img")
	if err := os.WriteFile(bomb, append(binary.LittleEndian.AppendUint64(nil, uint64(len(body))), body...), 0o600); err != nil {
		t.Fatal(err)
	}
	var err error
	if n := fuzzcheck.Allocated(func() { err = Read(bomb, &CriuKfd{}) }); n > 64<<20 {
		t.Errorf("refusing %d MiB of empty entries allocated %d MiB", len(body)>>20, n>>20)
	}
	if !errors.Is(err, protobound.ErrTooMany) {
		t.Errorf("Read of %d empty entries = %v, want them refused", maxMessages+1, err)
	}

	sparse := filepath.Join(dir, "amdgpu-kfd-2.img")
	if err := os.WriteFile(sparse, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(sparse, maxFile+1); err != nil {
		t.Fatal(err)
	}
	if err := Read(sparse, &CriuKfd{}); err == nil || !strings.Contains(err.Error(), "more than the plugin writes") {
		t.Errorf("Read of a %d-byte file = %v, want it refused by size", maxFile+1, err)
	}
}
