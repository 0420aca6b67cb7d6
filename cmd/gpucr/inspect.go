package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpucr/gpucr/internal/amd/amdimg"
	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/image"
)

// inspectOutput is what an image holds: gpucr's manifest and what CRIU's files say.
type inspectOutput struct {
	Dir      string           `json:"dir"`
	Manifest *image.Manifest  `json:"manifest"`
	CRIU     *criuimg.Summary `json:"criu"`
	AMD      *amdimg.Summary  `json:"amd,omitempty"`
}

func (a *app) inspectCmd() *cobra.Command {
	var files bool
	cmd := &cobra.Command{
		Use:   "inspect DIR",
		Short: "Show what an image holds: processes, memory, open files, GPUs, versions",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			m, err := image.Load(args[0])
			if err != nil {
				return err
			}
			sum, err := criuimg.Read(imageCRIUDir(args[0]))
			if err != nil {
				return err
			}
			out := inspectOutput{Dir: args[0], Manifest: m, CRIU: sum}
			if amd, err := amdimg.Summarize(imageCRIUDir(args[0])); err != nil {
				return err
			} else if len(amd.Processes) > 0 {
				out.AMD = amd
			}
			return a.emit(out, func() { printInspect(a.stdout, out, files) })
		},
	}
	cmd.Flags().BoolVar(&files, "files", false, "list each process's open files")
	return cmd
}

func imageCRIUDir(dir string) string { return strings.TrimRight(dir, "/") + "/" + image.CRIUDir }

func printAMD(w io.Writer, s *amdimg.Summary) {
	fmt.Fprintf(w, "amd gpus  (%s)\n", amdUntested)
	for _, p := range s.Processes {
		fmt.Fprintf(w, "  pid %d (%s): GPUs", p.PID, p.File)
		for _, g := range p.GPUs {
			fmt.Fprintf(w, " %d", g.GPUID)
		}
		fmt.Fprintln(w)
		for _, b := range p.Buffers {
			fmt.Fprintf(w, "    gpu %d %-10s %d x %s = %s\n", b.GPUID, b.Domain, b.Count, bytesHuman(b.Size), bytesHuman(b.Bytes))
		}
	}
}

func printInspect(w io.Writer, o inspectOutput, files bool) {
	m := o.Manifest
	fmt.Fprintf(w, "image     %s (format %d)\n", o.Dir, m.FormatVersion)
	fmt.Fprintf(w, "created   %s on %s (kernel %s, %s)\n", m.Created.Local().Format("2006-01-02 15:04:05 MST"), m.Host.Hostname, m.Host.Kernel, m.Host.Arch)
	fmt.Fprintf(w, "versions  gpucr %s, criu %s\n", m.GpucrVersion, m.CRIUVersion)
	fmt.Fprintf(w, "memory    %s in %d files\n", bytesHuman(o.CRIU.MemoryBytes), len(m.Files))
	if len(m.Phases) > 0 {
		fmt.Fprintf(w, "phases    %s\n", phasesLine(m.Phases))
	}
	fmt.Fprintln(w, "processes")
	depth := map[int]int{}
	for _, p := range o.CRIU.Processes {
		depth[p.PID] = depth[p.PPID] + 1
		fmt.Fprintf(w, "  %s%d %s  threads %d  memory %s\n", strings.Repeat("  ", depth[p.PID]-1), p.PID, p.Command, p.Threads, bytesHuman(p.MemoryBytes))
		if files {
			for _, f := range p.Files {
				fmt.Fprintf(w, "  %s    fd %d %s %s\n", strings.Repeat("  ", depth[p.PID]-1), f.FD, f.Type, f.Path)
			}
		}
	}
	if o.AMD != nil {
		printAMD(w, o.AMD)
	}
	for _, s := range m.GPUs {
		fmt.Fprintf(w, "gpus      %s driver %s, CUDA %s\n", s.Backend, s.DriverVersion, s.CUDAVersion)
		for _, d := range s.Devices {
			fmt.Fprintf(w, "  %d %s %s  cc %s  %s total, %s used  pci %s  numa %d\n", d.Index, d.UUID, d.Name, d.ComputeCapability,
				bytesHuman(d.MemoryTotal), bytesHuman(d.MemoryUsed), d.PCIBusID, d.NUMANode)
		}
		for _, p := range s.Processes {
			fmt.Fprintf(w, "  pid %d: %s of GPU memory on %s\n", p.PID, bytesHuman(p.MemoryBytes), strings.Join(p.Devices, ", "))
		}
	}
}
