package engine

import (
	"slices"
	"testing"

	"github.com/gpucr/gpucr/internal/criu"
	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/proctree"
)

// A tree in a PID namespace of its own is recorded with the PIDs it has in there: the
// processes holding device files without device state too, as the GPU processes are. They
// kept their host PIDs, which named no process of the image, and one equal to a GPU
// process's PID in there had the image refused as listing that process twice.
func TestManifestNumbersFileHoldersAsTheImage(t *testing.T) {
	tree := []proctree.Process{{PID: 5000, Command: "python"}, {PID: 5001, PPID: 5000, Command: "pt_data_worker"}, {PID: 1, PPID: 5000, Command: "pt_data_worker"}}
	ids := map[int]int{5000: 1, 5001: 2, 1: 3}
	snaps := []gpu.Snapshot{{Host: gpu.Host{Backend: "nvidia"}, Processes: []gpu.Process{{PID: 5000}}, FileHolders: []int{5001, 1}}}
	m := newManifest(&Engine{CRIU: &criu.Driver{}}, tree, ids, snaps, CheckpointRequest{})
	if got := m.GPUs[0].FileHolders; !slices.Equal(got, []int{2, 3}) {
		t.Fatalf("file holders recorded as %v, want the image's PIDs [2 3]", got)
	}
	if got := snaps[0].FileHolders; !slices.Equal(got, []int{5001, 1}) {
		t.Fatalf("the found snapshot's holders changed to %v", got)
	}
	if reason := gpu.Problem(m.GPUs); reason != "" {
		t.Fatalf("the image's GPU record: %s", reason)
	}
}
