// Package image owns gpucr's on-disk checkpoint image: its versioned manifest, the atomic
// commit that makes an image appear only when complete, and verification of every file.
package image

import (
	"encoding/json"
	"path/filepath"
	"time"

	"github.com/gpucr/gpucr/internal/criu"
	"github.com/gpucr/gpucr/internal/gpu"
)

// FormatVersion is the manifest format this build writes; it restores this one and older.
// Format 3 keeps a GPU backend's own facts (compute capability, CUDA version, ...) under
// "properties"; formats 1 and 2 kept them beside the common fields of a device and host
// (package gpu reads both). Format 2 records phase durations in seconds, as every other
// output of gpucr does; format 1 recorded them in nanoseconds ("durationNs").
const FormatVersion = 3

// ManifestName is the manifest's file name inside an image directory. SealName holds the
// SHA-256 of the manifest's bytes: the manifest checksums every other file, the seal
// checksums the manifest, so no byte of an image goes unchecked. SigName, when present,
// holds ed25519 signatures of the manifest's bytes (package signing).
const (
	ManifestName = "manifest.json"
	SealName     = "manifest.sha256"
	SigName      = "manifest.sig"
)

// CRIUDir holds CRIU's image files, LogsDir CRIU's logs, inside an image directory.
const (
	CRIUDir = "criu"
	LogsDir = "logs"
)

// CRIUPath is where CRIU's files are in the image directory dir.
func CRIUPath(dir string) string { return filepath.Join(dir, CRIUDir) }

// Manifest describes a complete image. Its presence, valid, is what makes a directory an image.
type Manifest struct {
	FormatVersion int       `json:"formatVersion"`
	GpucrVersion  string    `json:"gpucrVersion"`
	CRIUVersion   string    `json:"criuVersion"`
	Created       time.Time `json:"created"`
	Host          HostInfo  `json:"host"`
	RootPID       int       `json:"rootPid"`
	Options       Options   `json:"options"`
	Processes     []Process `json:"processes"`
	// MemoryBytes is the size of the process memory pages CRIU wrote.
	MemoryBytes uint64  `json:"memoryBytes"`
	Phases      []Phase `json:"phases"`
	// GPUs is per-backend device state; empty for CPU-only process trees.
	GPUs  []gpu.Snapshot `json:"gpus,omitempty"`
	Files []File         `json:"files"`
	// Reopened are the files CRIU opens again by their paths on restore, as they were when
	// checkpointed: a restore refuses one whose owner or kind changed since, which another
	// user may have put in its place (absent from images made before 2026-11-28).
	Reopened []HostFile `json:"reopened,omitempty"`
	// LinkedFiles are the POSIX semaphores the tree mapped under a deleted name, which CRIU
	// dumps only through a link beside the file that each restore consumes: a restore makes
	// the file and the link again from these (absent from images made before 2026-11-29).
	LinkedFiles []LinkedFile `json:"linkedFiles,omitempty"`
}

// LinkedFile is a small file of /dev/shm that the tree held under a deleted name: its
// other name, the link CRIU's image expects beside it, its mode, owner and bytes.
type LinkedFile struct {
	Path  string `json:"path"`  // absolute: /dev/shm/sem.NAME
	Remap string `json:"remap"` // link_remap.N, in the same directory
	Mode  uint32 `json:"mode"`  // permission bits
	UID   uint32 `json:"uid"`
	GID   uint32 `json:"gid"`
	Data  []byte `json:"data"`
}

// HostFile is a file of the host outside the image: its path, owner and kind.
type HostFile struct {
	Path string `json:"path"`
	UID  uint32 `json:"uid"`
	GID  uint32 `json:"gid"`
	Kind string `json:"kind"` // file, dir, symlink, fifo, socket, device
}

// HostInfo identifies the machine an image was taken on.
type HostInfo struct {
	Hostname string `json:"hostname"`
	Kernel   string `json:"kernel"`
	Arch     string `json:"arch"`
}

// Options are the checkpoint options that restore must repeat.
type Options struct {
	LeaveRunning bool `json:"leaveRunning"`
	criu.Flags
}

// Process is one process of the checkpointed tree.
type Process struct {
	PID     int    `json:"pid"`
	PPID    int    `json:"ppid"`
	Command string `json:"command"`
	Threads int    `json:"threads"`
}

// OwnPIDNamespace says whether the image's tree had a PID namespace of its own (a
// container's, or one unshared for it): its root is that namespace's PID 1, and the image
// numbers its processes as the namespace did, not as the host did.
func (m *Manifest) OwnPIDNamespace() bool { return m.RootPID == 1 }

// Leaves are the processes without children. gpucr saves and fills only their memory
// itself: a child may share its parent's memory copy-on-write, which CRIU must restore.
func (m *Manifest) Leaves() []int {
	parents := map[int]bool{}
	for _, p := range m.Processes {
		parents[p.PPID] = true
	}
	var out []int
	for _, p := range m.Processes {
		if !parents[p.PID] {
			out = append(out, p.PID)
		}
	}
	return out
}

// Phase is the wall time of one step of the checkpoint.
type Phase struct {
	Name     string
	Duration time.Duration
}

// phaseJSON is a Phase as manifests (and gpucr's --json) write it; DurationNs is how
// format 1 wrote it.
type phaseJSON struct {
	Name       string   `json:"name"`
	Seconds    *float64 `json:"seconds,omitempty"`
	DurationNs *int64   `json:"durationNs,omitempty"`
}

func (p Phase) MarshalJSON() ([]byte, error) {
	s := p.Duration.Seconds()
	return json.Marshal(phaseJSON{Name: p.Name, Seconds: &s})
}

func (p *Phase) UnmarshalJSON(b []byte) error {
	var j phaseJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	p.Name = j.Name
	switch {
	case j.Seconds != nil:
		p.Duration = time.Duration(*j.Seconds * float64(time.Second))
	case j.DurationNs != nil:
		p.Duration = time.Duration(*j.DurationNs)
	}
	return nil
}

// File is one file of the image with its size and checksums.
type File struct {
	Path  string `json:"path"` // slash-separated, relative to the image directory
	Size  int64  `json:"size"`
	XXH64 string `json:"xxh64"`
	// SHA256, in a signed image, is the SHA-256 of the SHA-256 digests of the file's
	// HashChunkSize pieces in order: what makes a signature of the manifest cover the file.
	SHA256 string `json:"sha256,omitempty"`
}

// Digested says whether every file records its SHA-256: only then does a signature of the
// manifest vouch for every byte of the image.
func (m *Manifest) Digested() bool {
	for _, f := range m.Files {
		if !f.Strong() {
			return false
		}
	}
	return true
}
