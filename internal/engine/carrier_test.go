package engine

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/gpu/gputest"
	"github.com/gpucr/gpucr/internal/safety"
	"github.com/gpucr/gpucr/internal/testutil"
)

// noPlugins is a target CRIU loads no plugin for, as a container is.
type noPlugins struct{ Target }

func (noPlugins) CRIUPlugins() bool { return false }
func (noPlugins) FilePlugins() bool { return false }

// A dry run of a target that loads no CRIU plugin (a container) finds the process whose
// device files only the plugin carries, as the checkpoint refuses it: with the plugin
// installed the backend no longer refused such a process itself, and a container's dry run
// with a DataLoader worker found nothing where its checkpoint was refused.
func TestDryRunFindsFilesNoPluginCarries(t *testing.T) {
	holder := testutil.StartSleeper(t).Process.Pid
	e := &Engine{Backends: []gpu.Backend{&gputest.Carrier{Checkpointer: &fakeGPU{}, Holder: holder}}}
	r := CheckpointRequest{LockTimeout: time.Second}

	a, err := e.Analyze(context.Background(), noPlugins{e.Tree(holder)}, r)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(a.Findings, func(f safety.Finding) bool { return f.Check == safety.CheckNoCUDAState })
	if i < 0 || a.Findings[i].PID != holder || a.Findings[i].Command != "sleep" {
		t.Fatalf("findings of a container's holder = %+v, want %s naming process %d (sleep)", a.Findings, safety.CheckNoCUDAState, holder)
	}
	// A process tree loads the plugin: nothing to find.
	a, err = e.Analyze(context.Background(), e.Tree(holder), r)
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(a.Findings, func(f safety.Finding) bool { return f.Check == safety.CheckNoCUDAState }) {
		t.Fatalf("findings of a process tree's holder = %+v, want none of %s", a.Findings, safety.CheckNoCUDAState)
	}
	// ... and says what the checkpoint carries by gpucr's own means.
	if len(a.Carried) != 1 || a.Carried[0].PID != holder || a.Carried[0].Command != "sleep" || !strings.Contains(a.Carried[0].What, "CRIU plugin") {
		t.Fatalf("carried = %+v, want process %d's device files", a.Carried, holder)
	}
}

// An image whose only record of a vendor is its processes holding device files without
// GPU state says so where that vendor's backend is off: it said the image held GPU state.
func TestOffBackendNamesWhatTheImageHolds(t *testing.T) {
	off := []gpu.Off{{Vendor: gpu.Vendor{Name: "nvidia"}, Reason: errors.New("no driver")}}
	for _, c := range []struct {
		snap gpu.Snapshot
		want string
	}{
		{gpu.Snapshot{Host: gpu.Host{Backend: "nvidia"}, Processes: []gpu.Process{{PID: 7}}}, "the image holds nvidia GPU state, and"},
		{gpu.Snapshot{Host: gpu.Host{Backend: "nvidia"}, FileHolders: []int{8}}, "the image holds processes holding nvidia device files without GPU state"},
	} {
		_, err := PlanGPUs(context.Background(), nil, off, []gpu.Snapshot{c.snap}, gpu.RestoreInput{})
		if !errors.Is(err, ErrNoBackend) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.snap, err, c.want)
		}
	}
}
