package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/store"
	"github.com/gpucr/gpucr/internal/store/chunked"
)

// lsEntry summarizes one stored checkpoint from its manifest object. Problem is set, and
// the rest empty, when the manifest object exists but cannot be used.
type lsEntry struct {
	URL         string         `json:"url"`
	Created     time.Time      `json:"created,omitzero"`
	Pushed      time.Time      `json:"pushed,omitzero"`
	Host        string         `json:"host,omitempty"`
	RootPID     int            `json:"rootPid,omitempty"`
	Processes   int            `json:"processes,omitempty"`
	MemoryBytes uint64         `json:"memoryBytes,omitempty"`
	Bytes       int64          `json:"bytes,omitempty"`
	StoredBytes int64          `json:"storedBytes,omitempty"`
	GPUs        []gpu.Snapshot `json:"gpus,omitempty"`
	Problem     string         `json:"problem,omitempty"`
}

func (a *app) lsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "ls s3://BUCKET[/PREFIX]|PATH",
		Short: "List the complete checkpoints at a store location, with what each holds",
		Example: examples(
			"gpucr ls s3://ckpts/train # the checkpoints under a prefix, with what each holds",
			"gpucr ls /srv/ckpt --json",
		),
		Long: "ls shows the location itself if it is a checkpoint, otherwise the checkpoints directly under it.\n" +
			"Only checkpoints whose push finished are listed.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, prefix, err := store.Open(cmd.Context(), args[0], a.cfg.s3)
			if err != nil {
				return classifyStore(err)
			}
			if err := checkLocalStore(args[0]); err != nil {
				return err
			}
			found, err := chunked.List(cmd.Context(), st, prefix)
			if err != nil {
				return err
			}
			out := make([]lsEntry, 0, len(found))
			for _, l := range found {
				out = append(out, newLsEntry(st, l))
			}
			return a.emit(out, func() { printLs(a.stdout, out) })
		},
	}
}

func newLsEntry(st store.Store, l chunked.Listed) lsEntry {
	e := lsEntry{URL: st.URL(l.Prefix), Problem: l.Problem}
	if m := l.Manifest; m != nil {
		im := m.Image
		e.Created, e.Pushed, e.Host, e.RootPID = im.Created, m.Pushed, im.Host.Hostname, im.RootPID
		e.Processes, e.MemoryBytes, e.GPUs, e.StoredBytes = len(im.Processes), im.MemoryBytes, im.GPUs, m.StoredBytes()
		for _, f := range m.Files {
			e.Bytes += f.Size
		}
	}
	return e
}

func printLs(w io.Writer, es []lsEntry) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECKPOINT\tCREATED\tHOST\tPROCESSES\tMEMORY\tGPU\tSTORED")
	for _, e := range es {
		// A store's checkpoints and what their manifest objects say are anyone's who can
		// write the store: shown without their control characters, as inspect shows an image.
		if e.Problem != "" {
			fmt.Fprintf(tw, "%s\tunusable: %s\n", printable(e.URL), printable(e.Problem))
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d (root %d)\t%s\t%s\t%s\n", printable(e.URL), e.Created.Local().Format("2006-01-02 15:04:05"),
			printable(e.Host), e.Processes, e.RootPID, bytesHuman(e.MemoryBytes), printable(gpuSummary(e.GPUs)), bytesHuman(uint64(e.StoredBytes)))
	}
	tw.Flush()
}

// gpuSummary is one short cell: the GPU models and the GPU memory the image holds.
func gpuSummary(ss []gpu.Snapshot) string {
	var parts []string
	for _, s := range ss {
		var mem uint64
		for _, p := range s.Processes {
			mem += p.MemoryBytes
		}
		models := map[string]int{}
		var order []string
		for _, d := range s.Devices {
			if models[d.Name] == 0 {
				order = append(order, d.Name)
			}
			models[d.Name]++
		}
		for _, name := range order {
			parts = append(parts, fmt.Sprintf("%dx %s", models[name], name))
		}
		parts = append(parts, bytesHuman(mem)+" GPU memory")
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

// checkLocalStore refuses a local store location that does not exist: a bucket has no
// directories, so nothing under a prefix is an empty store, but a local directory that is
// not there is a mistyped path — not an empty store to list, nor one to create and collect.
func checkLocalStore(loc string) error {
	if strings.HasPrefix(loc, "s3://") {
		return nil
	}
	if _, err := os.Stat(loc); err != nil {
		return usageError{fmt.Errorf("no store at %s: %w", loc, err)}
	}
	return nil
}
