package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpucr/gpucr/internal/image"
	"github.com/gpucr/gpucr/internal/interrupt"
	"github.com/gpucr/gpucr/internal/meter"
	"github.com/gpucr/gpucr/internal/store"
	"github.com/gpucr/gpucr/internal/store/chunked"
)

// transferOutput is what push and pull report.
type transferOutput struct {
	Image string `json:"image"` // the local image directory
	URL   string `json:"url"`   // the checkpoint in the store
	Files int    `json:"files"`
	Bytes int64  `json:"bytes"`
	// ZeroBytes were in zero chunks, which are recorded, not stored.
	ZeroBytes int64 `json:"zeroBytes"`
	// Chunks transferred (uploaded or downloaded), with their raw and compressed sizes.
	Chunks           int   `json:"chunks"`
	TransferredBytes int64 `json:"transferredBytes"`
	WireBytes        int64 `json:"wireBytes"`
	// PresentChunks were already in the store (push only): not uploaded again.
	PresentChunks int   `json:"presentChunks"`
	PresentBytes  int64 `json:"presentBytes"`
	// ReplacedChunks were found, in a store others can write, under their name with other
	// bytes, and uploaded again.
	ReplacedChunks int     `json:"replacedChunks,omitempty"`
	Seconds        float64 `json:"seconds"`
}

func newTransferOutput(dir, url string, s *chunked.Stats, d time.Duration) transferOutput {
	return transferOutput{Image: dir, URL: url, Files: s.Files, Bytes: s.Bytes, ZeroBytes: s.ZeroBytes,
		Chunks: s.Transferred, TransferredBytes: s.TransferredBytes, WireBytes: s.WireBytes,
		PresentChunks: s.Present, PresentBytes: s.PresentBytes, ReplacedChunks: s.Replaced, Seconds: d.Seconds()}
}

func (a *app) pushCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "push DIR s3://BUCKET/PREFIX|PATH",
		Short: "Store a verified image in object storage or a local store, deduplicated and compressed",
		Example: examples(
			"gpucr push /ckpt/train-1 s3://ckpts/train/step-1000 # verifies the image first",
			"gpucr push /ckpt/train-1 /srv/ckpt/train-1 # chunks in /srv/ckpt/chunks",
			"GPUCR_S3_ENDPOINT=http://minio:9000 gpucr push /ckpt/train-1 s3://ckpts/train/step-1000",
		),
		Long: "push verifies the image in DIR and stores it at s3://BUCKET/PREFIX (endpoint from GPUCR_S3_ENDPOINT\n" +
			"or AWS_ENDPOINT_URL, credentials from the AWS environment or ~/.aws) or at a local PATH. Chunks go to\n" +
			"a chunks/ directory beside PREFIX, shared with the checkpoints there: only new chunks are uploaded.\n" +
			"The checkpoint exists once its manifest object is written, last; an interrupted push can simply be rerun.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := localDir("push's DIR", args[0], "push takes the image directory first, then the store location"); err != nil {
				return err
			}
			if err := checkStoreParent(args[1]); err != nil {
				return err
			}
			ctx, stop := interrupt.Context(cmd.Context())
			defer stop()
			out, err := a.push(ctx, args[0], args[1])
			if err != nil {
				return err
			}
			return a.emit(out, func() { printPush(a, out) })
		},
	}
}

// push stores the image in dir at loc; checkpoint --to shares it.
func (a *app) push(ctx context.Context, dir, loc string) (transferOutput, error) {
	st, prefix, err := store.Open(ctx, loc, a.cfg.s3)
	if err != nil {
		return transferOutput{}, classifyStore(err)
	}
	count := new(meter.Counter)
	a.progress().StartBytes("push", count)
	start := time.Now()
	_, stats, err := chunked.Push(ctx, st, prefix, dir, chunked.Options{Progress: countInto(count), Waiting: a.storeBusy})
	a.progress().Done("push", time.Since(start))
	if outOfRoom(err) {
		err = diskFull("the store for "+st.URL(prefix), "free space there (gpucr gc removes the chunks no checkpoint uses) or push elsewhere",
			"the checkpoint was not stored, and a new push uploads only the chunks still missing", noRoomReason(err), err)
	}
	if err != nil {
		return transferOutput{}, classifyStore(err)
	}
	return newTransferOutput(dir, st.URL(prefix), stats, time.Since(start)), nil
}

func printPush(a *app, out transferOutput) {
	if out.Image == "" {
		fmt.Fprintf(a.stdout, "streamed to %s: %d files, %s\n", out.URL, out.Files, bytesHuman(uint64(out.Bytes)))
	} else {
		fmt.Fprintf(a.stdout, "pushed %s to %s: %d files, %s\n", out.Image, out.URL, out.Files, bytesHuman(uint64(out.Bytes)))
	}
	fmt.Fprintf(a.stdout, "  uploaded %d chunks, %s as %s; %d chunks (%s) already stored; %s of zeros not stored; %.2fs\n",
		out.Chunks, bytesHuman(uint64(out.TransferredBytes)), bytesHuman(uint64(out.WireBytes)),
		out.PresentChunks, bytesHuman(uint64(out.PresentBytes)), bytesHuman(uint64(out.ZeroBytes)), out.Seconds)
}

// classifyStore gives store errors users act on their exit code: a location gpucr cannot
// use, a checkpoint that is already there and a destination that is not empty are wrong
// requests.
func classifyStore(err error) error {
	switch {
	case errors.Is(err, store.ErrBadLocation), errors.Is(err, chunked.ErrExists), errors.Is(err, chunked.ErrNotEmpty), errors.Is(err, chunked.ErrNotStore),
		errors.Is(err, chunked.ErrUntrusted), errors.Is(err, chunked.ErrBadName):
		return usageError{err}
	}
	return classify(err)
}

// checkStoreParent refuses a local store location whose store directory (the one that
// holds it and chunks/) has no parent, as -D refuses an image directory without one
// (image.ParentExists): a local store's writes create every directory they need, so a
// mistyped path or an unmounted /mnt/... made a new store on the wrong disk. The store
// directory itself, and the location in it, are still created. An s3:// location has no
// directories to check.
func checkStoreParent(loc string) error {
	if loc == "" || strings.Contains(loc, "://") {
		return nil
	}
	return classify(image.ParentExists("store directory", filepath.Dir(filepath.Clean(loc))))
}

// storeBusy tells the user what a push or stream waits for before it moves anything.
func (a *app) storeBusy(what string) { a.log.Warn("the store is busy", "with", what) }

// countInto is a transfer's progress callback that counts into c.
func countInto(c *meter.Counter) func(done, total int64) {
	return func(done, total int64) {
		c.SetTotal(total)
		c.SetDone(done)
	}
}
