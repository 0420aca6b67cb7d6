package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpucr/gpucr/internal/interrupt"
	"github.com/gpucr/gpucr/internal/store"
	"github.com/gpucr/gpucr/internal/store/chunked"
)

func (a *app) pullCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "pull s3://BUCKET/PREFIX|PATH DIR",
		Short: "Fetch a stored checkpoint into an image directory, checking every chunk and file",
		Long: "pull fetches the checkpoint into DIR, which must not exist or be empty. Every chunk's sha256 is\n" +
			"checked as it arrives (a missing or corrupted chunk is named), then every file's checksum as\n" +
			"restore does; only a verified image is renamed to DIR.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := interrupt.Context(cmd.Context())
			defer stop()
			st, prefix, err := store.Open(ctx, args[0])
			if err != nil {
				return classifyStore(err)
			}
			bar := newBarProgress(a.stderr, "pull")
			start := time.Now()
			_, stats, err := chunked.Pull(ctx, st, prefix, args[1], chunked.Options{Progress: bar.update})
			bar.finish()
			if err != nil {
				return classifyStore(err)
			}
			out := newTransferOutput(args[1], st.URL(prefix), stats, time.Since(start))
			return a.emit(out, func() {
				fmt.Fprintf(a.stdout, "pulled %s to %s: %d files, %s verified (%d chunks, %s downloaded; %s of zeros) in %s\n",
					out.URL, out.Image, out.Files, bytesHuman(uint64(out.Bytes)), out.Chunks, bytesHuman(uint64(out.WireBytes)),
					bytesHuman(uint64(out.ZeroBytes)), seconds(time.Since(start)))
			})
		},
	}
}
