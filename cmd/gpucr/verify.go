package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/signing"
)

type verifyOutput struct {
	Dir   string `json:"dir"`
	OK    bool   `json:"ok"`
	Files int    `json:"files"`
	Bytes int64  `json:"bytes"`
	// SignedBy is the trusted key that signed the image, with --trust.
	SignedBy string `json:"signedBy,omitempty"`
}

func (a *app) verifyCmd() *cobra.Command {
	var trust trustFlags
	cmd := &cobra.Command{
		Use:   "verify DIR",
		Short: "Recompute every checksum of an image and name any file that is wrong",
		Example: examples(
			"gpucr verify /ckpt/train-1 # recompute every checksum, name a bad file",
			"gpucr verify /ckpt/train-1 --trust alice.pub # and refuse it unless alice signed it",
		),
		Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			keys, err := a.trusted(trust)
			if err != nil {
				return err
			}
			m, signer, err := image.OpenTrusted(args[0], keys)
			if errors.Is(err, signing.ErrUntrusted) {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			if err != nil {
				return err
			}
			out := verifyOutput{Dir: args[0], OK: true, Files: len(m.Files), SignedBy: signer}
			for _, f := range m.Files {
				out.Bytes += f.Size
			}
			return a.emit(out, func() {
				fmt.Fprintf(a.stdout, "ok: %s: %d files, %s verified\n", out.Dir, out.Files, bytesHuman(uint64(out.Bytes)))
				if out.SignedBy != "" {
					fmt.Fprintf(a.stdout, "  signed by trusted key %s\n", out.SignedBy)
				}
			})
		},
	}
	trust.add(cmd)
	return cmd
}
