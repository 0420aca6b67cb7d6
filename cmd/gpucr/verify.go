package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gpucr/gpucr/internal/image"
)

type verifyOutput struct {
	Dir   string `json:"dir"`
	OK    bool   `json:"ok"`
	Files int    `json:"files"`
	Bytes int64  `json:"bytes"`
}

func (a *app) verifyCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "verify DIR",
		Short: "Recompute every checksum of an image and name any file that is wrong",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			m, err := image.Open(args[0])
			if err != nil {
				return err
			}
			out := verifyOutput{Dir: args[0], OK: true, Files: len(m.Files)}
			for _, f := range m.Files {
				out.Bytes += f.Size
			}
			return a.emit(out, func() {
				fmt.Fprintf(a.stdout, "ok: %s: %d files, %s verified\n", out.Dir, out.Files, bytesHuman(uint64(out.Bytes)))
			})
		},
	}
}
