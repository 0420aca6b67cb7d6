package main

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpucr/gpucr/internal/criu"
	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/hwbreak"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/txn"
)

// checkReport is what `gpucr check` finds; text and JSON are built from it.
type checkReport struct {
	Ready bool        `json:"ready"`
	Root  bool        `json:"root"`
	CRIU  criuStatus  `json:"criu"`
	GPUs  []gpuStatus `json:"gpuBackends"`
	// Operations are the checkpoints and restores in the journal: in progress (held), or
	// left by a gpucr that died with its guardian (stale, for gpucr recover).
	Operations []txn.Entry `json:"operations"`
	// Stranded are GPU processes locked or checkpointed that no operation in progress holds.
	Stranded []int `json:"strandedGpuProcesses"`
	// JournalError is why the journal could not be read, or would not be trusted: every
	// verb then refuses, so the host is not ready.
	JournalError string   `json:"journalError,omitempty"`
	Notes        []string `json:"notes,omitempty"`
}

type criuStatus struct {
	OK          bool   `json:"ok"`
	Path        string `json:"path,omitempty"`
	Version     string `json:"version,omitempty"`
	KernelCheck string `json:"kernelCheck,omitempty"`
	// Env is what gpucr adds to CRIU's environment on this host (hwbreak): CRIU_FAULT=130
	// where hardware breakpoints never fire.
	Env   []string `json:"env,omitempty"`
	Error string   `json:"error,omitempty"`
}

// gpuStatus is one GPU vendor's readiness on this host.
type gpuStatus struct {
	Backend    string         `json:"backend"`
	Available  bool           `json:"available"`
	Reason     string         `json:"reason,omitempty"`
	Driver     string         `json:"driverVersion,omitempty"`
	Properties gpu.Properties `json:"properties,omitempty"`
	Devices    []gpu.Device   `json:"devices,omitempty"`
	Note       string         `json:"note,omitempty"`
}

func (a *app) checkCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "check",
		Short: "Say whether this host can checkpoint and restore, and which GPUs it supports",
		Example: examples(
			"gpucr check # is this host ready? CRIU, kernel, GPUs",
			"gpucr check --json # the same for scripts: exit 3 when it is not",
		),
		Args: cobra.NoArgs,
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
	r.CRIU.Env = hwbreak.CRIUEnv()
	if len(r.CRIU.Env) > 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("hardware breakpoints never fire on this host: gpucr runs CRIU with %s; "+
			"set it for container engines that run CRIU themselves (podman, containerd, CRI-O), or their dumps hang", strings.Join(r.CRIU.Env, " ")))
	}
	ready, off := gpu.Probe(a.gpuConfig(r.CRIU.Path))
	notes := map[string]string{}
	for _, v := range gpu.Vendors() {
		notes[v.Name] = v.Note
	}
	for _, b := range ready {
		if c, ok := b.(gpu.FileCarrier); ok && c.FilePluginDir() == "" {
			r.Notes = append(r.Notes, b.Name()+": processes forked after the GPU was in use (PyTorch DataLoader workers) cannot be "+
				"checkpointed here: gpucr's CRIU plugin for their device files is not installed beside CRIU; run scripts/install-deps.sh")
		}
		s := gpuStatus{Backend: b.Name(), Available: true, Note: notes[b.Name()]}
		if h, err := b.Host(ctx); err != nil {
			s.Available, s.Reason = false, err.Error()
		} else {
			s.Driver, s.Properties, s.Devices = h.DriverVersion, h.Properties, h.Devices
		}
		r.GPUs = append(r.GPUs, s)
	}
	for _, o := range off {
		r.GPUs = append(r.GPUs, gpuStatus{Backend: o.Name, Reason: o.Reason.Error(), Note: o.Note})
	}
	sort.Slice(r.GPUs, func(i, j int) bool { return r.GPUs[i].Backend < r.GPUs[j].Backend })
	var journal error
	r.Operations, r.Stranded, journal = a.checkOperations(ctx, ready)
	if journal != nil {
		r.JournalError = printable(oneLine(journal))
	}
	for _, op := range r.Operations {
		if !op.Held {
			r.Notes = append(r.Notes, fmt.Sprintf("the %s of %s was cut off when gpucr PID %d died in %s: run gpucr recover", op.Op, printable(op.Target), op.Owner.PID, printable(op.Phase)))
		}
	}
	for _, pid := range r.Stranded {
		r.Notes = append(r.Notes, fmt.Sprintf("PID %d is stranded on its GPU (locked or checkpointed, no gpucr operation holds it): gpucr recover --pid %d", pid, pid))
	}
	if !r.Root {
		r.Notes = append(r.Notes, "run gpucr as root: CRIU needs it")
	}
	r.Ready = r.Root && r.CRIU.OK && r.JournalError == ""
	return r
}

// checkOperations reads the journal and finds GPU processes stranded outside it. A journal
// it cannot read (or will not trust) is returned as the error, and no process is called
// stranded: one a live operation holds would be, and recover --pid would take it mid-way.
func (a *app) checkOperations(ctx context.Context, backends []gpu.Backend) ([]txn.Entry, []int, error) {
	ops, err := txn.List(a.runDir)
	if err != nil {
		return []txn.Entry{}, []int{}, err
	}
	if ops == nil {
		ops = []txn.Entry{}
	}
	all, err := proctree.All()
	if err != nil {
		return ops, []int{}, nil
	}
	var candidates []int
	for _, p := range all {
		if txn.HolderIn(ops, p.PID) == nil && p.PID != os.Getpid() {
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
	return ops, out, nil
}

// notReadyReason is the one line that says why the host is not ready, its root cause
// first: run by a user, CRIU's check fails too, and the line was CRIU's advice to setcap
// its binary, which does not make a host ready for gpucr, which every verb refuses to run
// but as root (documentation walk: gpucr check as nobody).
func notReadyReason(r checkReport) string {
	switch {
	case !r.Root:
		return "gpucr must run as root (CRIU needs it)"
	case !r.CRIU.OK:
		return r.CRIU.Error
	}
	return r.JournalError
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
		note := ""
		if g.Note != "" {
			note = " (" + g.Note + ")"
		}
		if !g.Available {
			fmt.Fprintf(w, "off  gpu %s: %s%s\n", g.Backend, g.Reason, note)
			continue
		}
		fmt.Fprintf(w, "ok   gpu %s: driver %s%s, %d device(s)%s\n", g.Backend, g.Driver, propertiesLine(g.Properties), len(g.Devices), note)
		for _, d := range g.Devices {
			fmt.Fprintf(w, "       %d %s %s  %s  numa %d%s\n", d.Index, d.UUID, d.Name, bytesHuman(d.MemoryTotal), d.NUMANode, propertiesLine(d.Properties))
		}
	}
	if r.JournalError != "" {
		fmt.Fprintf(w, "NO   journal: %s\n", r.JournalError)
	}
	for _, op := range r.Operations {
		state := "in progress"
		if !op.Held {
			state = "CUT OFF"
		}
		fmt.Fprintf(w, "op   %s of %s: %s (gpucr PID %d, %s, since %s)\n", op.Op, printable(op.Target), state, op.Owner.PID, printable(op.Phase), op.Started.Format(time.RFC3339))
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

// propertiesLine shows a backend's own facts as ", name value" pairs in name order.
func propertiesLine(p gpu.Properties) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(p)) {
		fmt.Fprintf(&b, ", %s %s", k, p[k])
	}
	return b.String()
}
