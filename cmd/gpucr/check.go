package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpucr/gpucr/internal/amd/kfd"
	"github.com/gpucr/gpucr/internal/amd/plugin"
	"github.com/gpucr/gpucr/internal/criu"
	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/txn"
)

// checkReport is what `gpucr check` finds; text and JSON are built from it.
type checkReport struct {
	Ready bool        `json:"ready"`
	Root  bool        `json:"root"`
	CRIU  criuStatus  `json:"criu"`
	GPUs  []gpuStatus `json:"gpuBackends"`
	AMD   amdStatus   `json:"amd"`
	// Operations are the checkpoints and restores in the journal: in progress (held), or
	// left by a gpucr that died with its guardian (stale, for gpucr recover).
	Operations []txn.Entry `json:"operations"`
	// Stranded are GPU processes locked or checkpointed that no operation in progress holds.
	Stranded []int    `json:"strandedGpuProcesses"`
	Notes    []string `json:"notes,omitempty"`
}

type criuStatus struct {
	OK          bool   `json:"ok"`
	Path        string `json:"path,omitempty"`
	Version     string `json:"version,omitempty"`
	KernelCheck string `json:"kernelCheck,omitempty"`
	Error       string `json:"error,omitempty"`
}

// amdStatus is AMD readiness: KFD present, CRIU's amdgpu plugin found.
type amdStatus struct {
	Available bool   `json:"available"`
	Reason    string `json:"reason,omitempty"`
	GPUs      int    `json:"gpus"`
	Plugin    string `json:"pluginDir,omitempty"`
	Note      string `json:"note"`
}

// amdUntested is said wherever AMD support shows: it is built and tested on fixtures only.
const amdUntested = "gpucr's AMD support has not been run on AMD hardware"

func checkAMD(criuPath string) amdStatus {
	s := amdStatus{Note: amdUntested}
	if criuPath != "" {
		s.Plugin = plugin.Find(criuPath)
	}
	nodes, err := kfd.Read(kfd.DefaultRoot)
	switch {
	case err != nil:
		s.Reason = "no AMD KFD driver (" + kfd.DefaultRoot + " unreadable); AMD GPU support is off"
	case len(kfd.GPUs(nodes)) == 0:
		s.Reason = "KFD lists no GPUs; AMD GPU support is off"
	case s.Plugin == "":
		s.Reason = plugin.ErrMissing.Error()
	default:
		s.Available, s.GPUs = true, len(kfd.GPUs(nodes))
	}
	return s
}

type gpuStatus struct {
	Backend   string       `json:"backend"`
	Available bool         `json:"available"`
	Reason    string       `json:"reason,omitempty"`
	Driver    string       `json:"driverVersion,omitempty"`
	CUDA      string       `json:"cudaVersion,omitempty"`
	Devices   []gpu.Device `json:"devices,omitempty"`
}

func (a *app) checkCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "check",
		Short: "Say whether this host can checkpoint and restore, and which GPUs it supports",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r := a.check(cmd.Context())
			if err := a.emit(r, func() { printCheck(a, r) }); err != nil {
				return err
			}
			if !r.Ready {
				return notReadyError{reason: notReadyReason(r), reported: true}
			}
			return nil
		},
	}
}

func (a *app) check(ctx context.Context) checkReport {
	if ctx == nil {
		ctx = context.Background()
	}
	r := checkReport{Root: os.Geteuid() == 0}
	if d, err := criu.Find(a.criuBinary()); err != nil {
		r.CRIU.Error = err.Error()
	} else {
		r.CRIU.Path, r.CRIU.Version = d.Path, d.VersionString()
		verdict, err := d.KernelCheck(ctx)
		r.CRIU.KernelCheck = verdict
		if err != nil {
			r.CRIU.Error = err.Error()
		} else {
			r.CRIU.OK = true
		}
	}
	ready, unavailable := gpu.Probe(a.cfg.gpu)
	for _, b := range ready {
		s := gpuStatus{Backend: b.Name(), Available: true}
		if h, err := b.Host(ctx); err != nil {
			s.Available, s.Reason = false, err.Error()
		} else {
			s.Driver, s.CUDA, s.Devices = h.DriverVersion, h.CUDAVersion, h.Devices
		}
		r.GPUs = append(r.GPUs, s)
	}
	for name, why := range unavailable {
		r.GPUs = append(r.GPUs, gpuStatus{Backend: name, Reason: why.Error()})
	}
	sort.Slice(r.GPUs, func(i, j int) bool { return r.GPUs[i].Backend < r.GPUs[j].Backend })
	r.AMD = checkAMD(r.CRIU.Path)
	r.Operations, r.Stranded = a.checkOperations(ctx, ready)
	for _, op := range r.Operations {
		if !op.Held {
			r.Notes = append(r.Notes, fmt.Sprintf("the %s of %s was cut off when gpucr PID %d died in %s: run gpucr recover", op.Op, op.Target, op.Owner.PID, op.Phase))
		}
	}
	for _, pid := range r.Stranded {
		r.Notes = append(r.Notes, fmt.Sprintf("PID %d is stranded on its GPU (locked or checkpointed, no gpucr operation holds it): gpucr recover --pid %d", pid, pid))
	}
	if !r.Root {
		r.Notes = append(r.Notes, "run gpucr as root: CRIU needs it")
	}
	r.Ready = r.Root && r.CRIU.OK
	return r
}

// checkOperations reads the journal and finds GPU processes stranded outside it.
func (a *app) checkOperations(ctx context.Context, backends []gpu.Backend) ([]txn.Entry, []int) {
	ops, err := txn.List(a.runDir)
	if err != nil {
		a.log.Warn("journal unreadable", "err", err)
	}
	if ops == nil {
		ops = []txn.Entry{}
	}
	busy := map[int]bool{}
	for _, op := range ops {
		for _, g := range op.GPUs {
			busy[g.PID] = op.Held
		}
	}
	all, err := proctree.All()
	if err != nil {
		return ops, []int{}
	}
	var candidates []int
	for _, p := range all {
		if !busy[p.PID] && p.PID != os.Getpid() {
			candidates = append(candidates, p.PID)
		}
	}
	out := []int{}
	for _, b := range backends {
		set, err := stranded(ctx, []gpu.Backend{b}, candidates)
		if err != nil {
			a.log.Warn("could not look for stranded GPU processes", "backend", b.Name(), "err", err)
			continue
		}
		out = append(out, set.PIDs()...)
	}
	return ops, out
}

func notReadyReason(r checkReport) string {
	if !r.CRIU.OK {
		return r.CRIU.Error
	}
	return "not running as root"
}

func printCheck(a *app, r checkReport) {
	w := a.stdout
	mark := map[bool]string{true: "ok", false: "NO"}
	fmt.Fprintf(w, "%-4s root\n", mark[r.Root])
	if r.CRIU.OK {
		fmt.Fprintf(w, "%-4s criu %s at %s (kernel: %s)\n", mark[true], r.CRIU.Version, r.CRIU.Path, r.CRIU.KernelCheck)
	} else {
		fmt.Fprintf(w, "%-4s criu: %s\n", mark[false], r.CRIU.Error)
	}
	for _, g := range r.GPUs {
		if !g.Available {
			fmt.Fprintf(w, "off  gpu %s: %s\n", g.Backend, g.Reason)
			continue
		}
		fmt.Fprintf(w, "ok   gpu %s: driver %s, CUDA %s, %d device(s)\n", g.Backend, g.Driver, g.CUDA, len(g.Devices))
		for _, d := range g.Devices {
			fmt.Fprintf(w, "       %d %s %s  cc %s  %s  numa %d\n", d.Index, d.UUID, d.Name, d.ComputeCapability, bytesHuman(d.MemoryTotal), d.NUMANode)
		}
	}
	if r.AMD.Available {
		fmt.Fprintf(w, "ok   gpu amd: %d GPU(s), CRIU amdgpu plugin in %s (%s)\n", r.AMD.GPUs, r.AMD.Plugin, r.AMD.Note)
	} else {
		fmt.Fprintf(w, "off  gpu amd: %s (%s)\n", r.AMD.Reason, r.AMD.Note)
	}
	for _, op := range r.Operations {
		state := "in progress"
		if !op.Held {
			state = "CUT OFF"
		}
		fmt.Fprintf(w, "op   %s of %s: %s (gpucr PID %d, %s, since %s)\n", op.Op, op.Target, state, op.Owner.PID, op.Phase, op.Started.Format(time.RFC3339))
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note %s\n", n)
	}
	if r.Ready {
		fmt.Fprintln(w, "ready: this host can checkpoint and restore processes")
	} else {
		fmt.Fprintf(w, "not ready: %s\n", notReadyReason(r))
	}
}
