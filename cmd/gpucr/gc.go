package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gpucr/gpucr/internal/interrupt"
	"github.com/gpucr/gpucr/internal/store"
	"github.com/gpucr/gpucr/internal/store/chunked"
)

// collectOutput is what rm and gc report.
type collectOutput struct {
	Deleted       string `json:"deleted,omitempty"` // rm: the checkpoint removed
	Dir           string `json:"dir"`               // the store directory whose chunks were collected
	Checkpoints   int    `json:"checkpoints"`       // complete checkpoints left there
	KeptChunks    int    `json:"keptChunks"`        // chunks they reference
	RemovedChunks int    `json:"removedChunks"`     // with dryRun: that would be removed
	RemovedBytes  int64  `json:"removedBytes"`
	DryRun        bool   `json:"dryRun,omitempty"`
	// Stopped is set when a push started during the collection: it stopped for the push,
	// and some unreferenced chunks may remain for the next gc.
	Stopped bool `json:"stopped,omitempty"`
}

func newCollectOutput(st store.Store, dir string, c *chunked.Collected) collectOutput {
	return collectOutput{Dir: st.URL(dir), Checkpoints: c.Checkpoints, KeptChunks: c.Kept,
		RemovedChunks: c.Removed, RemovedBytes: c.RemovedBytes, Stopped: c.Stopped}
}

func (a *app) rmCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "rm s3://BUCKET/PREFIX|PATH",
		Short: "Delete a stored checkpoint and the chunks no other checkpoint beside it uses",
		Example: examples(
			"gpucr rm s3://ckpts/train/step-1000 # and the chunks only it used",
			"gpucr rm /srv/ckpt/train-1",
		),
		Long: "rm deletes the checkpoint's manifest object, which alone makes it a checkpoint, then removes the\n" +
			"chunks in its directory that no remaining checkpoint references (as gc does). Checkpoints stored\n" +
			"under it stay.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := interrupt.Context(cmd.Context())
			defer stop()
			st, prefix, err := store.Open(ctx, args[0], a.cfg.s3)
			if err != nil {
				return classifyStore(err)
			}
			c, err := chunked.Delete(ctx, st, prefix)
			if err != nil {
				return classifyStore(err)
			}
			out := newCollectOutput(st, chunked.ParentDir(prefix), c)
			out.Deleted = st.URL(prefix)
			return a.emit(out, func() { printCollect(a, out) })
		},
	}
}

func (a *app) gcCmd() *cobra.Command {
	var dryRun bool
	c := &cobra.Command{
		Use:   "gc s3://BUCKET[/DIR]|PATH",
		Short: "Remove the chunks no stored checkpoint references: left by deleted checkpoints and killed pushes",
		Example: examples(
			"gpucr gc s3://ckpts/train --dry-run # count what would be removed",
			"gpucr gc s3://ckpts/train # remove the chunks no checkpoint uses (killed pushes)",
		),
		Long: "gc looks at the checkpoints directly under the location and removes the chunks in its chunks/\n" +
			"that none of them references. It waits for no one: while a push works there it refuses, and it\n" +
			"stops between batches for a push that starts. A manifest it cannot read makes it remove nothing.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := interrupt.Context(cmd.Context())
			defer stop()
			st, dir, err := store.Open(ctx, args[0], a.cfg.s3)
			if err != nil {
				return classifyStore(err)
			}
			if err := checkLocalStore(args[0]); err != nil {
				return err
			}
			if err := notACheckpoint(ctx, st, dir); err != nil {
				return err
			}
			c, err := chunked.Collect(ctx, st, dir, dryRun)
			if err != nil {
				return classifyStore(err)
			}
			out := newCollectOutput(st, dir, c)
			out.DryRun = dryRun
			return a.emit(out, func() { printCollect(a, out) })
		},
	}
	c.Flags().BoolVar(&dryRun, "dry-run", false, "count what would be removed, remove nothing")
	return c
}

// notACheckpoint refuses a checkpoint's own location: its chunks are in its parent.
func notACheckpoint(ctx context.Context, st store.Store, dir string) error {
	if dir == "" {
		return nil
	}
	_, err := chunked.Load(ctx, st, dir)
	switch {
	case errors.Is(err, chunked.ErrNoCheckpoint):
		return nil
	case err != nil && !chunked.Unusable(err):
		return err
	}
	return usageError{fmt.Errorf("%s is a checkpoint: its chunks are in %s; gc that, or rm the checkpoint",
		st.URL(dir), st.URL(chunked.ParentDir(dir)))}
}

func printCollect(a *app, o collectOutput) {
	if o.Deleted != "" {
		fmt.Fprintf(a.stdout, "deleted %s\n", o.Deleted)
	}
	verb := "removed"
	if o.DryRun {
		verb = "would remove"
	}
	fmt.Fprintf(a.stdout, "%s %d chunks (%s) that no checkpoint in %s references; %d checkpoints keep %d chunks\n",
		verb, o.RemovedChunks, bytesHuman(uint64(o.RemovedBytes)), o.Dir, o.Checkpoints, o.KeptChunks)
	if o.Stopped {
		fmt.Fprintln(a.stdout, "stopped early, for a push that started meanwhile or because the collection was held up past its lease's life: run gc again (once the push is done)")
	}
}
