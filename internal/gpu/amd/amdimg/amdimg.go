package amdimg

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/gpucr/gpucr/internal/beneath"
	"github.com/gpucr/gpucr/internal/gpu/amd/kfd"
	"github.com/gpucr/gpucr/internal/protobound"
)

// File name patterns the plugin uses, with CRIU's file id in place of %d.
const (
	KFDFilePattern    = "amdgpu-kfd-%d.img"
	RenderFilePattern = "amdgpu-renderD-%d.img"
)

// sizeLen is the length of the plugin's size_t header.
const sizeLen = 8

// Write writes m to path as the plugin does: 8-byte little-endian length, then m. The
// encoding is deterministic, so equal messages give equal files.
func Write(path string, m proto.Message) error {
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode %s: %w", path, err)
	}
	buf := binary.LittleEndian.AppendUint64(make([]byte, 0, sizeLen+len(body)), uint64(len(body)))
	if err := os.WriteFile(path, append(buf, body...), 0o600); err != nil {
		return fmt.Errorf("write AMD GPU image: %w", err)
	}
	return nil
}

// Bounds of what Read takes from a file, which may come from a crafted image: its size (the
// plugin's largest part, the kernel's private data of a process's queues and buffers, is
// megabytes), and the messages it decodes to (about a hundred bytes each, from as little
// as two bytes of the file).
const (
	maxFile     = 1 << 30
	maxMessages = 4 << 20
)

// Read reads a file written by the plugin (or Write) into m. The length header must match
// the rest of the file exactly, so a truncated or padded image is reported, not half-read.
// It reads only a regular file, no symlink followed: a FIFO planted under the plugin's name
// in an image hung inspect (hostile test).
func Read(path string, m proto.Message) error {
	f, err := beneath.Open(filepath.Dir(path), filepath.Base(path))
	if err != nil {
		return fmt.Errorf("read AMD GPU image: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("read AMD GPU image: %w", err)
	}
	if fi.Size() > maxFile {
		return fmt.Errorf("%s: larger than %d MiB, more than the plugin writes", path, maxFile>>20)
	}
	data := make([]byte, fi.Size())
	if _, err := io.ReadFull(f, data); err != nil {
		return fmt.Errorf("read AMD GPU image: %w", err)
	}
	if len(data) < sizeLen {
		return fmt.Errorf("%s: %d bytes, shorter than the %d-byte size header: %w", path, len(data), sizeLen, io.ErrUnexpectedEOF)
	}
	size, body := binary.LittleEndian.Uint64(data), data[sizeLen:]
	switch {
	case size > uint64(len(body)):
		return fmt.Errorf("%s: header says %d bytes, %d follow: %w", path, size, len(body), io.ErrUnexpectedEOF)
	case size < uint64(len(body)):
		return fmt.Errorf("%s: header says %d bytes, %d follow", path, size, len(body))
	}
	if _, err := protobound.Cost(body, m.ProtoReflect().Descriptor(), maxMessages); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := proto.Unmarshal(body, m); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// Nodes turns an image's device entries into KFD topology nodes, as the checkpointed host
// looked, so restore can map them onto this host's (kfd.Read) with amd.Map. Properties
// holds every numeric field by its proto name; NUMA nodes come from the io links.
func Nodes(k *CriuKfd) []kfd.Node {
	nodes := make([]kfd.Node, 0, len(k.GetDeviceEntries()))
	for _, d := range k.GetDeviceEntries() {
		n := kfd.Node{
			ID: d.GetNodeId(), GPUID: d.GetGpuId(), Properties: properties(d),
			SIMDCount: d.GetSimdCount(), CPUCoresCount: d.GetCpuCoresCount(), MemBanksCount: d.GetMemBanksCount(),
			CachesCount: d.GetCachesCount(), IOLinksCount: d.GetIoLinksCount(), VendorID: d.GetVendorId(),
			DeviceID: d.GetDeviceId(), Domain: d.GetDomain(), DRMRenderMinor: d.GetDrmRenderMinor(),
			HiveID: d.GetHiveId(), FWVersion: d.GetFwVersion(), SDMAFWVersion: d.GetSdmaFwVersion(),
			NumGWS: d.GetNumGws(), Capability: d.GetCapability(), LocalMemSize: d.GetVramSize(), NUMANode: -1,
		}
		for _, l := range d.GetIolinks() {
			n.IOLinks = append(n.IOLinks, kfd.IOLink{Type: l.GetType(), NodeFrom: n.ID, NodeTo: l.GetNodeToId()})
		}
		nodes = append(nodes, n)
	}
	kfd.SetNUMANodes(nodes)
	return nodes
}

// properties returns the set numeric fields of m by their proto names.
func properties(m proto.Message) map[string]uint64 {
	p := map[string]uint64{}
	m.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Kind() == protoreflect.Uint32Kind || fd.Kind() == protoreflect.Uint64Kind {
			if fd.Cardinality() != protoreflect.Repeated {
				p[string(fd.Name())] = v.Uint()
			}
		}
		return true
	})
	return p
}
