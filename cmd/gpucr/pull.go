package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpucr/gpucr/internal/engine"
	"github.com/gpucr/gpucr/internal/interrupt"
	"github.com/gpucr/gpucr/internal/meter"
	"github.com/gpucr/gpucr/internal/signing"
	"github.com/gpucr/gpucr/internal/store"
	"github.com/gpucr/gpucr/internal/store/chunked"
)

func (a *app) pullCmd() *cobra.Command {
	var trust trustFlags
	cmd := &cobra.Command{
		Use:   "pull s3://BUCKET/PREFIX|PATH DIR",
		Short: "Fetch a stored checkpoint into an image directory, checking every chunk and file",
		Example: examples(
			"gpucr pull s3://ckpts/train/step-1000 /ckpt/train-1 # every chunk and file checked",
			"gpucr pull /srv/ckpt/train-1 /ckpt/train-1 --trust alice.pub # only if alice signed it",
		),
		Long: "pull fetches the checkpoint into DIR, which must not exist or be empty. Every chunk is\n" +
			"checked as it arrives (a missing or corrupted chunk is named), then every file's checksum as\n" +
			"restore does; only a verified image is renamed to DIR.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := localDir("pull's DIR", args[1], "pull takes the store location first, then the directory to fill"); err != nil {
				return err
			}
			ctx, stop := interrupt.Context(cmd.Context())
			defer stop()
			keys, err := a.trusted(trust)
			if err != nil {
				return err
			}
			out, err := a.pull(ctx, args[0], args[1], keys)
			if err != nil {
				return err
			}
			return a.emit(out, func() { printPull(a, out) })
		},
	}
	trust.add(cmd)
	return cmd
}

// pull fetches the checkpoint at loc into dir; restore --from shares it.
func (a *app) pull(ctx context.Context, loc, dir string, trust signing.Keys) (transferOutput, error) {
	st, prefix, err := store.Open(ctx, loc, a.cfg.s3)
	if err != nil {
		return transferOutput{}, classifyStore(err)
	}
	// Journaled before it is made: a pull killed halfway leaves its staging (up to the
	// image's size) to the next gpucr's recovery, not beside DIR for good.
	sd, err := engine.NewStagingBeside(a.runDir, "pull "+st.URL(prefix), dir)
	if err != nil {
		return transferOutput{}, classify(err)
	}
	defer func() { _ = sd.Close() }()
	count := new(meter.Counter)
	a.progress().StartBytes("pull", count)
	start := time.Now()
	_, stats, err := chunked.Pull(ctx, st, prefix, dir, chunked.Options{Progress: countInto(count), Trust: trust, Staging: sd.Dir})
	a.progress().Done("pull", time.Since(start))
	if err != nil {
		return transferOutput{}, classifyStore(err)
	}
	return newTransferOutput(dir, st.URL(prefix), stats, time.Since(start)), nil
}

func printPull(a *app, out transferOutput) {
	fmt.Fprintf(a.stdout, "pulled %s to %s: %d files, %s verified (%d chunks, %s downloaded; %s of zeros) in %.2fs\n",
		out.URL, out.Image, out.Files, bytesHuman(uint64(out.Bytes)), out.Chunks, bytesHuman(uint64(out.WireBytes)),
		bytesHuman(uint64(out.ZeroBytes)), out.Seconds)
}
