package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/engine"
	"github.com/gpucr/gpucr/internal/gpu"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/interrupt"
)

// restoreOutput is the summary of a restore, for text and JSON alike.
type restoreOutput struct {
	Dir       string                       `json:"dir"`
	Container string                       `json:"container,omitempty"`
	RootPID   int                          `json:"rootPid"`
	GPUMap    map[string]map[string]string `json:"gpuMap,omitempty"`
	Pulled    *transferOutput              `json:"pulled,omitempty"`   // the fetch of --from with -D
	Streamed  *streamOutput                `json:"streamed,omitempty"` // --from without -D
	SignedBy  string                       `json:"signedBy,omitempty"`
	Phases    []image.Phase                `json:"phases"`
	Total     float64                      `json:"totalSeconds"`
	CRIUStats *criuimg.RestoreStats        `json:"criuRestoreStats,omitempty"`

	// RootPID above is the host's PID; a container's own, its init's, is ContainerPID (1).
	ContainerPID int `json:"containerPid,omitempty"`
}

// checkImport refuses an --import the restore could not finish, before the archive is
// unpacked. Without -D there is nowhere to unpack it, and the refusal named only -D and
// --from; without --container the archive was unpacked into DIR and only then refused as a
// process tree, exit 1, leaving DIR full for the retry to trip over (documentation walk).
// An archive always holds a container: checkpoint --export needs --container.
func checkImport(imported, dir, ctr string) error {
	switch {
	case imported == "":
		return nil
	case dir == "":
		return usageError{fmt.Errorf("--import %s needs -D DIR, the directory to unpack the archive into", imported)}
	case ctr == "":
		return usageError{fmt.Errorf("--import %s needs --container ID: an archive holds a container (gpucr restore --container ID --import FILE -D DIR)", imported)}
	}
	return nil
}

func (a *app) restoreCmd() *cobra.Command {
	var r engine.RestoreRequest
	var skips []string
	var ctr, newID, bundle, from, imported string
	var pulled *transferOutput
	var streamed *streamedRestore
	var rf runcFlags
	var trust trustFlags
	cmd := &cobra.Command{
		Use:   "restore [--container ID] -D DIR | --from LOCATION",
		Short: "Restore a process tree or runc container (and its GPU state) from an image directory, detached",
		Example: examples(
			"gpucr restore -D /ckpt/train-1 # detached: prints the restored root's PID",
			"gpucr restore -D /ckpt/train-1 --gpu-map 0=1 # onto GPU 1 instead of GPU 0",
			"gpucr restore --from s3://ckpts/train/step-1000 # its memory streamed from the store",
			"gpucr restore --container trainer -D /ckpt/trainer --new-id trainer-2",
		),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := localDir("-D", r.Dir, "to restore from a store, give that location to --from"); err != nil {
				return err
			}
			var err error
			if r.Skips, err = gpu.SkipsFrom(gpu.Vendors(), skips, os.Getenv); err != nil {
				return usageError{err}
			}
			if r.Trust, err = a.trusted(trust); err != nil {
				return err
			}
			if imported != "" && from != "" {
				return usageError{fmt.Errorf("--import and --from cannot be combined")}
			}
			if err := checkImport(imported, r.Dir, ctr); err != nil {
				return err
			}
			if ctr == "" {
				// Before anything is pulled or unpacked for a restore that would refuse.
				if err := refuseContainerOnly(cmd); err != nil {
					return err
				}
			}
			if from == "" && r.Dir == "" {
				return usageError{fmt.Errorf("restore needs --images-dir DIR, or --from LOCATION")}
			}
			if err := engine.CanRestoreHere(); err != nil {
				return classify(err) // after the request's own mistakes, before anything is fetched
			}
			if init := engine.StartedByNamespaceInit(); init != "" {
				a.log.Warn("the restored processes will live in this PID namespace, whose first process (PID 1, " + init +
					") is gpucr's parent: the kernel kills them when it exits; keep it running, or restore from outside the namespace")
			}
			if from != "" && r.Dir == "" {
				ctx, stop := interrupt.Context(cmd.Context())
				streamed, err = a.stream(ctx, from, r.Trust, &r)
				stop()
				if err != nil {
					return err
				}
				defer func() {
					if err := streamed.Close(); err != nil {
						a.log.Warn("the fetched files are left for the next gpucr to remove", "err", err)
					}
				}()
			} else if from != "" {
				ctx, stop := interrupt.Context(cmd.Context())
				p, err := a.pull(ctx, from, r.Dir, r.Trust)
				stop()
				if err != nil {
					return err
				}
				pulled = &p
			}
			if imported != "" {
				ctx, stop := interrupt.Context(cmd.Context())
				err := a.importArchive(ctx, imported, r.Dir, r.Trust)
				stop()
				if err != nil {
					return err
				}
			}
			target, err := a.restoreTarget(cmd, rf, r.Dir, ctr, newID, bundle)
			if err != nil {
				return err
			}
			start := time.Now()
			var res *engine.RestoreResult
			err = a.withEngine(cmd, r.Options, func(ctx context.Context, e *engine.Engine) (err error) {
				res, err = e.Restore(ctx, target(e), r)
				return err
			})
			if err != nil {
				return classifyContainer(err)
			}
			out := restoreOutput{Dir: r.Dir, RootPID: res.RootPID, GPUMap: res.GPUMap, Pulled: pulled, SignedBy: res.SignedBy,
				Phases: res.Phases, Total: time.Since(start).Seconds(), CRIUStats: res.CRIUStats}
			if ctr != "" {
				out.Container, out.ContainerPID = cmp.Or(newID, ctr), res.Manifest.RootPID
			}
			if streamed != nil {
				out.Dir, out.Streamed = streamed.url, streamed.output()
			}
			return a.emit(out, func() {
				if pulled != nil {
					printPull(a, *pulled)
				}
				if out.Streamed != nil {
					printStream(a, out.Streamed)
				}
				printRestore(a, out, res.Phases)
			})
		},
	}
	f := cmd.Flags()
	f.StringVarP(&r.Dir, "images-dir", "D", "", "image directory to restore from")
	f.StringVar(&from, "from", "", "restore from s3://BUCKET/PREFIX or a local store PATH, its memory streamed from the store; with -D, pull the whole image into DIR first")
	f.StringVar(&imported, "import", "", "first unpack the checkpoint archive FILE (gpucr checkpoint --export) into DIR, verified")
	f.StringVar(&r.GPUMap, "gpu-map", "", `restore onto other GPUs: "0=1,1=0" by index or "GPU-old=GPU-new" by UUID`)
	f.StringSliceVar(&skips, "skip-check", nil, "switch off a GPU compatibility check by name (repeatable): "+strings.Join(gpu.CheckNames(gpu.Vendors()), ", "))
	f.StringVar(&ctr, "container", "", "restore the runc container the image holds, checkpointed with this ID")
	f.StringVar(&newID, "new-id", "", "with --container: restore the container under this ID instead")
	f.StringVar(&bundle, "bundle", "", "with --container: the OCI bundle to restore with (default: the one it was checkpointed from)")
	// Hidden: a slower way kept to measure what gpucr's memory fill wins (gpucr-bench).
	f.BoolVar(&r.CRIURestoresPages, "criu-restores-pages", false, "let CRIU restore all memory pages itself, not gpucr")
	_ = f.MarkHidden("criu-restores-pages")
	trust.add(cmd)
	rf.bind(cmd)
	criuFlags(cmd, &r.Options)
	return cmd
}

func printRestore(a *app, out restoreOutput, phases []image.Phase) {
	if out.Container != "" {
		fmt.Fprintf(a.stdout, "restored container %s (init PID %d) from %s in %.2fs\n", out.Container, out.RootPID, out.Dir, out.Total)
	} else {
		fmt.Fprintf(a.stdout, "restored PID %d from %s in %.2fs\n", out.RootPID, out.Dir, out.Total)
	}
	if out.SignedBy != "" {
		fmt.Fprintf(a.stdout, "  signed  by trusted key %s\n", out.SignedBy)
	}
	for backend, m := range out.GPUMap {
		olds := make([]string, 0, len(m))
		for o := range m {
			olds = append(olds, o)
		}
		sort.Strings(olds)
		for _, o := range olds {
			fmt.Fprintf(a.stdout, "  %s GPU %s -> %s\n", printable(backend), printable(o), printable(m[o])) // the image's
		}
	}
	fmt.Fprintf(a.stdout, "  phases  %s\n", phasesLine(phases))
}
