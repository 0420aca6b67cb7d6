package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpucr/gpucr/internal/criufold"
	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/interrupt"
)

// foldOutput is what `gpucr fold` wrote.
type foldOutput struct {
	From    string  `json:"from"`
	Dir     string  `json:"dir"`
	Runs    int     `json:"runs"`  // files of mem/ folded into CRIU's page files
	Bytes   int64   `json:"bytes"` // their bytes
	Seconds float64 `json:"seconds"`
}

func (a *app) foldCmd() *cobra.Command {
	var trust trustFlags
	cmd := &cobra.Command{
		Use:   "fold DIR NEWDIR",
		Short: "Copy an image with the memory gpucr saved itself folded into CRIU's page files, so that plain criu restore restores it",
		Long: "fold verifies the image at DIR and writes a new image at NEWDIR (absent or empty) in which the memory\n" +
			"runs gpucr kept in mem/ are in CRIU's own pagemaps and page files: `criu restore -D NEWDIR/criu` alone\n" +
			"then restores the processes with all their memory. GPU state is not CRIU's: after a plain CRIU restore\n" +
			"it still needs gpucr (or cuda-checkpoint). NEWDIR stays a gpucr image, restorable by gpucr as well.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			keys, err := a.trusted(trust)
			if err != nil {
				return err
			}
			m, _, err := image.OpenTrusted(args[0], keys)
			if err != nil {
				return classify(err)
			}
			ctx, stop := interrupt.Context(cmd.Context())
			defer stop()
			start := time.Now()
			res, err := criufold.Fold(ctx, args[0], m, args[1])
			if err != nil {
				return classify(err)
			}
			out := foldOutput{From: args[0], Dir: args[1], Runs: res.Runs, Bytes: res.Bytes, Seconds: time.Since(start).Seconds()}
			return a.emit(out, func() {
				fmt.Fprintf(a.stdout, "folded %d memory run(s), %s, of %s into CRIU's page files: %s in %.2fs\n",
					out.Runs, bytesHuman(uint64(out.Bytes)), out.From, out.Dir, out.Seconds)
				fmt.Fprintf(a.stdout, "  criu restore -D %s/criu restores the CPU side; GPU state still needs gpucr\n", out.Dir)
			})
		},
	}
	trust.add(cmd)
	return cmd
}
