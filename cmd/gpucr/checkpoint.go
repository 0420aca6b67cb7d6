package main

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpucr/gpucr/internal/criu"
	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/engine"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/interrupt"
	"github.com/gpucr/gpucr/internal/proctree"
	"github.com/gpucr/gpucr/internal/signing"
	"github.com/gpucr/gpucr/internal/store"
	"github.com/gpucr/gpucr/internal/store/chunked"
)

// criuFlags binds the CRIU options that checkpoint and restore share.
func criuFlags(cmd *cobra.Command, o *criu.Options) {
	f := cmd.Flags()
	f.BoolVarP(&o.ShellJob, "shell-job", "j", false, "the tree is attached to a terminal (a shell job)")
	f.BoolVar(&o.TCPEstablished, "tcp-established", false, "checkpoint and restore established TCP connections")
	f.BoolVar(&o.ExtUnixSk, "ext-unix-sk", false, "allow unix sockets connected to processes outside the tree")
	f.BoolVar(&o.FileLocks, "file-locks", false, "checkpoint and restore file locks")
	f.IntVar(&o.LogLevel, "criu-log-level", criu.DefaultLogLevel, "CRIU's log verbosity, 0-4 (4 to debug a failure)")
	f.StringVar(&o.NetworkLock, "network-lock", "", `how CRIU blocks TCP traffic while frozen: nftables (default), iptables, or skip when all peers are in the tree`)
}

// checkpointOutput is the summary of a checkpoint, for text and JSON alike.
type checkpointOutput struct {
	Dir          string        `json:"dir"`
	Container    string        `json:"container,omitempty"`
	SignedBy     string        `json:"signedBy,omitempty"`
	RootPID      int           `json:"rootPid"`
	Processes    int           `json:"processes"`
	MemoryBytes  uint64        `json:"memoryBytes"`
	GPUProcesses int           `json:"gpuProcesses"`
	GPUBytes     uint64        `json:"gpuMemoryBytes"`
	LeftRunning  bool          `json:"leftRunning"`
	Phases       []image.Phase `json:"phases"`
	// Paused is how long the workload was stopped: from its GPUs' lock (or its freeze) to
	// running again, or to its end when not left running.
	Paused float64 `json:"pausedSeconds"`
	Total  float64 `json:"totalSeconds"`
	// Pushed is the upload of --to: with -D the image is written to DIR first, then
	// stored; without, it is Streamed: pages go to the store as CRIU dumps them.
	Pushed   *transferOutput `json:"pushed,omitempty"`
	Streamed bool            `json:"streamed,omitempty"`
	// CRIUStats is CRIU's own account of the dump (local images: kept in DIR/logs).
	CRIUStats *criuimg.DumpStats `json:"criuDumpStats,omitempty"`
	// Exported is the archive of --export.
	Exported *exportOutput `json:"exported,omitempty"`
	// RootPID above is the host's PID; the image numbers a container's processes as the
	// container does, its init as ContainerPID (1).
	ContainerPID int `json:"containerPid,omitempty"`
	// Outputs are the files a tree left running holds open write-only from a position (a
	// job's output sent with >), with their sizes now: one that grows before a restore must
	// be truncated back to that size first, as CRIU restores it only as it was.
	Outputs []outputFile `json:"outputs,omitempty"`
}

type outputFile struct {
	Path string `json:"path"` // from the image's root: a container's, for a container
	Size int64  `json:"size"`
}

// outputsOf lists the files of the image's CRIU directory that outputFile describes,
// sorted; none if they cannot be read (the note is informational).
func outputsOf(criuDir string) []outputFile {
	outputs, err := criuimg.OutputFiles(criuDir)
	if err != nil {
		return nil
	}
	var out []outputFile
	for name, size := range outputs {
		if size >= 0 {
			out = append(out, outputFile{Path: "/" + name, Size: size})
		}
	}
	slices.SortFunc(out, func(a, b outputFile) int { return strings.Compare(a.Path, b.Path) })
	return out
}

// checkFree refuses, before a checkpoint begins, a store location it could not be pushed
// to once written to dir (-D DIR --to LOC): a bad name, a checkpoint there already, or a
// local one that is dir, or inside it, or holds it (hostile test: -D X --to X said it
// succeeded, and the store's files in X made the image fail to verify).
func (a *app) checkFree(ctx context.Context, loc, dir string) error {
	st, prefix, err := store.Open(ctx, loc, a.cfg.s3)
	if err == nil {
		err = chunked.CheckFree(ctx, st, prefix)
	}
	if err != nil {
		return classifyStore(err)
	}
	if _, local := st.(*store.Dir); local && (within(st.URL(prefix), dir) || within(dir, st.URL(prefix))) {
		return usageError{fmt.Errorf("--to %s and -D %s overlap: the store's files would change the image; give them places apart", loc, dir)}
	}
	return nil
}

// within says whether path is dir or inside it, both made absolute.
func within(path, dir string) bool {
	p, err1 := filepath.Abs(path)
	d, err2 := filepath.Abs(dir)
	return err1 == nil && err2 == nil && (p == d || strings.HasPrefix(p, d+string(filepath.Separator)))
}

// storeAndEmit stores the checkpoint written to dir at to, when given, and prints out.
func (a *app) storeAndEmit(ctx context.Context, out checkpointOutput, phases []image.Phase, dir, to string) error {
	if to != "" {
		pushed, err := a.push(ctx, dir, to)
		if err != nil {
			return fmt.Errorf("checkpoint written to %s, but storing it failed (retry with gpucr push): %w", dir, err)
		}
		out.Pushed = &pushed
	}
	return a.emit(out, func() {
		printCheckpoint(a, out, phases)
		if out.Pushed != nil {
			printPush(a, *out.Pushed)
		}
	})
}

// checkpointStreamed checkpoints target straight into the store at loc: the memory pages
// go from CRIU through gpucr's page server to the store, and only CRIU's other files are
// staged, in a temporary directory that is removed afterwards.
func (a *app) checkpointStreamed(ctx context.Context, e *engine.Engine, target engine.Target, r engine.CheckpointRequest, loc string) (*transferOutput, *engine.Checkpointed, error) {
	sc, err := a.openStream(ctx, loc, r.Sign != nil)
	if err != nil {
		return nil, nil, err
	}
	defer sc.close()
	r.Dir, r.Stream = sc.dir, sc.s
	r.Scratch = []string{sc.staging.Dir} // removed by the guardian if gpucr dies
	m, err := e.Checkpoint(ctx, target, r)
	if m == nil {
		return nil, nil, classifyStore(err)
	}
	return sc.output(), m, err
}

// streamed is a checkpoint on its way to a store: the stream, and where CRIU's small files
// are staged.
type streamed struct {
	s       *chunked.Stream
	url     string
	staging *engine.StagingDir
	dir     string // the image to stage, in staging
	start   time.Time
	log     *slog.Logger
}

// openStream starts a streamed checkpoint into loc; signed makes it take every file's
// SHA-256, which a signed manifest must record.
func (a *app) openStream(ctx context.Context, loc string, signed bool) (*streamed, error) {
	st, prefix, err := store.Open(ctx, loc, a.cfg.s3)
	if err != nil {
		return nil, classifyStore(err)
	}
	// Journaled before it exists: a gpucr killed before the checkpoint begins leaves it to
	// the next one's recovery.
	staging, err := engine.NewStagingDir(a.runDir, "checkpoint --to "+st.URL(prefix), "gpucr-stream-")
	if err != nil {
		return nil, classify(err)
	}
	s, err := chunked.NewStream(ctx, st, prefix, chunked.Options{Signed: signed, Waiting: a.storeBusy})
	if err != nil {
		return nil, classifyStore(errors.Join(err, staging.Close()))
	}
	return &streamed{s: s, url: st.URL(prefix), staging: staging, dir: filepath.Join(staging.Dir, "image"), start: time.Now(), log: a.log}, nil
}

// close gives the stream up unless it was finished, and removes the staging directory.
func (sc *streamed) close() {
	sc.s.Abort()
	if err := sc.staging.Close(); err != nil {
		sc.log.Warn("the staged files are left for the next gpucr to remove", "err", err)
	}
}

func (sc *streamed) output() *transferOutput {
	stats := sc.s.Stats()
	out := newTransferOutput("", sc.url, &stats, time.Since(sc.start))
	return &out
}

func (a *app) checkpointCmd() *cobra.Command {
	var r engine.CheckpointRequest
	var to string
	var ctr string
	var rf runcFlags
	var signPath string
	var skips []string
	var dryRun bool
	var exportFile string
	cmd := &cobra.Command{
		Use:   "checkpoint {PID | --container ID} {-D DIR | --to LOCATION | -D DIR --to LOCATION}",
		Short: "Checkpoint a running process tree or runc container (and its GPU state) to an image directory",
		Example: examples(
			"gpucr checkpoint 4242 -D /ckpt/train-1 # the job stops once it is saved",
			"gpucr checkpoint 4242 -R --to s3://ckpts/train/step-1000 # streamed to a store; the job runs on",
			"gpucr checkpoint --container trainer -D /ckpt/trainer # a runc container",
			"gpucr checkpoint 4242 --dry-run # only say whether it could be restored",
		),
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			// Before anything is made (an export's staging) or a dry run reports.
			if r.LockTimeout < 0 {
				return usageError{fmt.Errorf("--lock-timeout %v: give a duration of 0 (no limit) or more", r.LockTimeout)}
			}
			if err := localDir("-D", r.Dir, "to store a checkpoint, give that location to --to"); err != nil {
				return err
			}
			target, err := a.checkpointTarget(cmd, args, ctr, rf, r.Options)
			if err != nil {
				return err
			}
			if r.SkipChecks, err = checkpointSkips(skips); err != nil {
				return err
			}
			if dryRun {
				return a.dryRun(cmd, target, r)
			}
			if err := checkStoreParent(to); err != nil {
				return err
			}
			var export *exporter
			if exportFile != "" {
				if export, err = newExporter(a.runDir, exportFile, ctr, to, rf.path, &r.Dir); err != nil {
					return err
				}
			}
			if r.Dir == "" && to == "" {
				return usageError{fmt.Errorf("say where the image goes: -D DIR, --to s3://BUCKET/PREFIX|PATH, or both")}
			}

			if r.Dir != "" && to != "" {
				if err := a.checkFree(cmd.Context(), to, r.Dir); err != nil {
					export.abandon()
					return err
				}
			}
			if r.Sign, err = a.loadSigningKey(signPath); err != nil {
				export.abandon()
				return err
			}
			start := time.Now()
			var m *engine.Checkpointed
			var streamed *transferOutput
			var released error // the image is written, what became of the tree after failed
			root := &hostRoot{}
			err = a.withEngine(cmd, r.Options, func(ctx context.Context, e *engine.Engine) (err error) {
				root.Target = target(e)
				if r.Dir == "" {
					streamed, m, err = a.checkpointStreamed(ctx, e, root, r, to)
				} else {
					m, err = e.Checkpoint(ctx, root, r)
				}
				if m != nil {
					released, err = err, nil
				}
				return err
			})
			if err != nil {
				if m == nil {
					export.abandon()
				}
				return classifyContainer(explainFullDisk(err, r.Dir == ""))
			}
			out := checkpointOutput{
				Dir: r.Dir, Container: ctr, RootPID: root.pid, Processes: len(m.Processes), MemoryBytes: m.MemoryBytes,
				LeftRunning: r.LeaveRunning && released == nil, Phases: m.Phases, Paused: m.Paused.Seconds(), Total: time.Since(start).Seconds(),
			}
			if ctr != "" {
				out.ContainerPID = m.RootPID
			}
			if r.Sign != nil {
				out.SignedBy = signing.ID(r.Sign.Public().(ed25519.PublicKey))
			}
			if streamed != nil {
				out.Dir, out.Streamed, out.Pushed = streamed.URL, true, streamed
				to = ""
			} else {
				// Informational: an unreadable statistics file does not fail a written checkpoint.
				out.CRIUStats, _ = criuimg.ReadDumpStats(filepath.Join(r.Dir, image.LogsDir))
				if out.LeftRunning {
					out.Outputs = outputsOf(image.CRIUPath(r.Dir))
				}
			}
			if released != nil {
				to = "" // not stored: the error below says what happened
			}
			for _, s := range m.GPUs {
				for _, p := range s.Processes {
					out.GPUProcesses++
					out.GPUBytes += p.MemoryBytes
				}
			}
			ctx, stop := interrupt.Context(cmd.Context())
			defer stop()
			if export != nil {
				if out.Exported, err = export.write(ctx, m.Manifest); err != nil {
					return err
				}
				if export.temp {
					out.Dir = ""
				}
			}
			if err := a.storeAndEmit(ctx, out, m.Phases, r.Dir, to); err != nil {
				return err
			}
			return released
		},
	}
	f := cmd.Flags()
	f.StringVarP(&r.Dir, "images-dir", "D", "", "image directory to create (must not exist or be empty)")
	f.StringVar(&to, "to", "", "store the image at s3://BUCKET/PREFIX or a local store PATH; without -D the memory streams there, never written locally")
	f.BoolVarP(&r.LeaveRunning, "leave-running", "R", false, "leave the process tree running after the checkpoint")
	f.DurationVar(&r.LockTimeout, "lock-timeout", 10*time.Second, "how long to wait for GPU work in flight before giving up")
	f.StringVar(&ctr, "container", "", "checkpoint the runc container with this ID instead of a PID's tree")
	f.StringVar(&signPath, "sign", "", "sign the image's manifest with this ed25519 private key (see gpucr keygen); default: this host's, if it has one ("+signing.HostKey+", or $GPUCR_SIGNING_KEY)")
	f.BoolVar(&dryRun, "dry-run", false, "only run the restorability analysis and print every finding; nothing is locked, frozen or written")
	f.StringSliceVar(&skips, "skip-check", nil, "switch off a restorability check by name (repeatable): "+skippableChecks())
	// Hidden: a slower way kept to measure what gpucr's page server wins (gpucr-bench).
	f.BoolVar(&r.CRIUWritesPages, "criu-writes-pages", false, "let CRIU write all memory pages itself, not gpucr")
	_ = f.MarkHidden("criu-writes-pages")
	f.StringVar(&exportFile, "export", "", "with --container: also write the checkpoint as one archive FILE in podman's layout (.tar, .tar.gz or .tar.zst), readable by checkpointctl; without -D only the archive is kept")
	f.BoolVar(&r.CRIUCompatible, "criu-compatible", false, "keep all memory in CRIU's own page files (none in gpucr's mem/), so that plain criu restore restores the CPU side")
	rf.bind(cmd)
	criuFlags(cmd, &r.Options)
	return cmd
}

// hostRoot is a checkpoint's target that remembers the host's PID of the root of the tree
// it opens: the image numbers a container's processes as the container does.
type hostRoot struct {
	engine.Target
	pid int
}

func (h *hostRoot) Open(ctx context.Context) ([]proctree.Process, error) {
	tree, err := h.Target.Open(ctx)
	if len(tree) > 0 {
		h.pid = tree[0].PID
	}
	return tree, err
}

func printCheckpoint(a *app, out checkpointOutput, phases []image.Phase) {
	what, to := fmt.Sprintf("PID %d", out.RootPID), "to"
	if out.Container != "" {
		what = "container " + out.Container
	}
	if out.Streamed {
		to = "streamed to"
	}
	where := out.Dir
	if where == "" && out.Exported != nil {
		where = out.Exported.File
	}
	fmt.Fprintf(a.stdout, "checkpointed %s (%d processes) %s %s in %.2fs\n", what, out.Processes, to, where, out.Total)
	fmt.Fprintf(a.stdout, "  memory  %s written\n", bytesHuman(out.MemoryBytes))
	if out.GPUProcesses > 0 {
		fmt.Fprintf(a.stdout, "  gpu     %d process(es), %s of GPU memory\n", out.GPUProcesses, bytesHuman(out.GPUBytes))
	}
	if out.SignedBy != "" {
		fmt.Fprintf(a.stdout, "  signed  by key %s\n", out.SignedBy)
	}
	fmt.Fprintf(a.stdout, "  phases  %s\n", phasesLine(phases))
	if out.Exported != nil {
		printExport(a.stdout, out.Exported)
	}
	switch {
	case out.LeftRunning && out.Container != "":
		fmt.Fprintf(a.stdout, "  the container was left running (paused %.2fs)\n", out.Paused)
	case out.LeftRunning:
		fmt.Fprintf(a.stdout, "  the process tree was left running (paused %.2fs)\n", out.Paused)
	}
	inside := ""
	if out.Container != "" {
		inside = " in the container"
	}
	for _, o := range out.Outputs {
		fmt.Fprintf(a.stdout, "  output  %s%s is held open for writing (%d bytes now): if it grows, a restore of this image needs it truncated back first (%s)\n",
			printable(o.Path), inside, o.Size, engine.TruncateCommand(o.Path, uint64(o.Size), inside))
	}
}
