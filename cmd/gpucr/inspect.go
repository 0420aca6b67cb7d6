package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpucr/gpucr/internal/beneath"
	"github.com/gpucr/gpucr/internal/container"
	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/memfill"
)

// inspectOutput is what an image holds: gpucr's manifest and what CRIU's files say. A
// runc checkpoint directory has no manifest: runc's descriptors and, when the runc
// integration took it, the action script's GPU record stand in.
type inspectOutput struct {
	Dir         string            `json:"dir"`
	Manifest    *image.Manifest   `json:"manifest,omitempty"`
	Container   *container.Info   `json:"container,omitempty"`
	Descriptors []string          `json:"runcDescriptors,omitempty"`
	GPURecord   *container.Record `json:"gpuRecord,omitempty"`
	CRIU        *criuimg.Summary  `json:"criu"`
	// CRIUStats is CRIU's own account of the dump, kept with a gpucr image's logs.
	CRIUStats *criuimg.DumpStats `json:"criuDumpStats,omitempty"`
	// GPUState is what vendors' CRIU plugins keep in CRIU's files, by vendor.
	GPUState map[string]any `json:"gpuPluginState,omitempty"`
	// Archive describes a checkpoint archive (gpucr's export or podman's) read in place.
	Archive *archiveInspect `json:"archive,omitempty"`
	lines   map[string][]string
}

func (a *app) inspectCmd() *cobra.Command {
	var files bool
	cmd := &cobra.Command{
		Use:   "inspect {DIR | ARCHIVE}",
		Short: "Show what an image, a runc checkpoint directory or a checkpoint archive holds: processes, memory, open files, GPUs, versions",
		Example: examples(
			"gpucr inspect /ckpt/train-1 # processes, memory, GPUs, versions",
			"gpucr inspect /ckpt/train-1 --files --json # with each process's open files, as JSON",
			"gpucr inspect trainer.tar.zst # an archive of checkpoint --export, or podman's",
		),
		Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			if isArchive(args[0]) {
				out, err := inspectArchive(args[0])
				if err != nil {
					return err
				}
				return a.emit(out, func() { printInspect(terminalSafe{a.stdout}, out, files) })
			}
			out, criuDir, err := loadInspect(args[0])
			if err != nil {
				return err
			}
			if out.CRIU, err = criuimg.Read(criuDir); err != nil {
				return err
			}
			if out.Manifest != nil {
				if out.CRIUStats, err = criuimg.ReadDumpStats(filepath.Join(args[0], image.LogsDir)); err != nil {
					return err
				}
				// Memory gpucr saved itself belongs to its process as much as CRIU's pages.
				saved, err := memfill.SavedBytes(args[0], out.Manifest)
				if err != nil {
					return err
				}
				for i, p := range out.CRIU.Processes {
					out.CRIU.Processes[i].MemoryBytes += uint64(saved[p.PID])
				}
			}
			if err := describeGPUState(&out, criuDir); err != nil {
				return err
			}
			return a.emit(out, func() { printInspect(terminalSafe{a.stdout}, out, files) })
		},
	}
	cmd.Flags().BoolVar(&files, "files", false, "list each process's open files")
	return cmd
}

// runcDescriptors is the file where runc keeps the paths of a container's standard
// descriptors, beside CRIU's files: a few hundred bytes.
const (
	runcDescriptors    = "descriptors.json"
	maxRuncDescriptors = 1 << 20
)

// loadInspect reads dir's manifest and container description, or, for a runc checkpoint
// directory (CRIU's files, no manifest), runc's descriptors and the GPU record; it returns
// where CRIU's files are.
func loadInspect(dir string) (inspectOutput, string, error) {
	out := inspectOutput{Dir: dir}
	m, err := image.Load(dir)
	if err == nil {
		out.Manifest = m
		if out.Container, err = container.ReadInfo(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return out, "", err
		}
		return out, image.CRIUPath(dir), nil
	}
	if _, serr := os.Stat(filepath.Join(dir, "pstree.img")); !errors.Is(err, image.ErrNoManifest) || serr != nil {
		return out, "", err
	}
	// Beneath dir, regular and small, as container.json: a symlink to /dev/zero made
	// inspect fill its memory, a FIFO made it wait for good (hostile test).
	b, err := beneath.ReadFile(dir, runcDescriptors, maxRuncDescriptors)
	if err == nil {
		err = json.Unmarshal(b, &out.Descriptors)
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return out, "", fmt.Errorf("read %s: %w", filepath.Join(dir, runcDescriptors), err)
	}
	if out.GPURecord, err = container.ReadRecord(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return out, "", err
	}
	return out, dir, nil
}

// describeGPUState asks each vendor what its CRIU plugin keeps in criuDir.
func describeGPUState(out *inspectOutput, criuDir string) error {
	for _, v := range gpu.Vendors() {
		if v.Describe == nil {
			continue
		}
		d, err := v.Describe(criuDir)
		if err != nil {
			return fmt.Errorf("%s GPU state: %w", v.Name, err)
		}
		if d == nil {
			continue
		}
		if out.GPUState == nil {
			out.GPUState, out.lines = map[string]any{}, map[string][]string{}
		}
		out.GPUState[v.Name], out.lines[v.Name] = d.Data, d.Lines
	}
	return nil
}

func printInspect(w io.Writer, o inspectOutput, files bool) {
	m := o.Manifest
	var gpus []gpu.Snapshot
	if o.Archive != nil {
		printArchive(w, o.Archive, o.Container)
	}
	if m != nil {
		fmt.Fprintf(w, "image     %s (format %d)\n", o.Dir, m.FormatVersion)
		fmt.Fprintf(w, "created   %s on %s (kernel %s, %s)\n", m.Created.Local().Format("2006-01-02 15:04:05 MST"), m.Host.Hostname, m.Host.Kernel, m.Host.Arch)
		fmt.Fprintf(w, "versions  gpucr %s, criu %s\n", m.GpucrVersion, m.CRIUVersion)
		if o.Container != nil {
			fmt.Fprintf(w, "container %s (bundle %s)\n", o.Container.ID, o.Container.Bundle)
		}
		// The manifest's figure counts the memory gpucr saved itself beside CRIU's pages.
		fmt.Fprintf(w, "memory    %s in %d files\n", bytesHuman(m.MemoryBytes), len(m.Files))
		if len(m.Phases) > 0 {
			fmt.Fprintf(w, "phases    %s\n", phasesLine(m.Phases))
		}
		if st := o.CRIUStats; st != nil {
			fmt.Fprintf(w, "criu dump frozen %s: freezing %s, memdump %s, memwrite %s; %d of %d pages written\n",
				seconds(st.Frozen), seconds(st.Freezing), seconds(st.MemDump), seconds(st.MemWrite), st.PagesWritten, st.PagesScanned)
		}
		gpus = m.GPUs
	} else {
		fmt.Fprintf(w, "image     %s (runc/CRIU checkpoint: no gpucr manifest, files not checksummed)\n", o.Dir)
		if len(o.Descriptors) > 0 {
			fmt.Fprintf(w, "stdio     %s\n", strings.Join(o.Descriptors, "  "))
		}
		if o.GPURecord != nil {
			fmt.Fprintf(w, "versions  gpucr %s (runc integration)\n", o.GPURecord.GpucrVersion)
			gpus = o.GPURecord.GPUs
		}
		fmt.Fprintf(w, "memory    %s\n", bytesHuman(o.CRIU.MemoryBytes))
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
	for _, name := range slices.Sorted(maps.Keys(o.lines)) {
		fmt.Fprintf(w, "%s gpu state in CRIU's files\n", name)
		for _, l := range o.lines[name] {
			fmt.Fprintf(w, "  %s\n", l)
		}
	}
	for _, s := range gpus {
		fmt.Fprintf(w, "gpus      %s driver %s%s\n", s.Backend, s.DriverVersion, propertiesLine(s.Properties))
		for _, d := range s.Devices {
			fmt.Fprintf(w, "  %d %s %s  %s total, %s used  pci %s  numa %d%s\n", d.Index, d.UUID, d.Name,
				bytesHuman(d.MemoryTotal), bytesHuman(d.MemoryUsed), d.PCIBusID, d.NUMANode, propertiesLine(d.Properties))
		}
		for _, p := range s.Processes {
			fmt.Fprintf(w, "  pid %d: %s of GPU memory on %s\n", p.PID, bytesHuman(p.MemoryBytes), strings.Join(p.Devices, ", "))
		}
		// Shown as the JSON shows them: an image listing only such processes printed no
		// process under its GPU record, nor that its restore needs gpucr's CRIU plugin.
		for _, pid := range s.FileHolders {
			fmt.Fprintf(w, "  pid %d: %s device files without GPU state, which gpucr's CRIU plugin opens again\n", pid, s.Backend)
		}
	}
}
