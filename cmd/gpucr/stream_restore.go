package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gpucr/gpucr/internal/engine"
	"github.com/gpucr/gpucr/internal/signing"
	"github.com/gpucr/gpucr/internal/store"
	"github.com/gpucr/gpucr/internal/store/chunked"
)

// streamOutput is what restore --from without -D fetched and streamed.
type streamOutput struct {
	URL string `json:"url"`
	// FetchedFiles and FetchedBytes are the files fetched to local disk (CRIU's, gpucr's
	// manifest), in FetchSeconds; LocalBound is the most local disk the restore may use.
	FetchedFiles int     `json:"fetchedFiles"`
	FetchedBytes int64   `json:"fetchedBytes"`
	FetchSeconds float64 `json:"fetchSeconds"`
	LocalBound   int64   `json:"localBoundBytes"`
	// MemoryBytes of saved memory were written into the processes straight from the store:
	// Chunks fetched (TransferredBytes raw, WireBytes compressed), ZeroBytes not fetched.
	MemoryBytes      int64 `json:"memoryBytes"`
	Chunks           int   `json:"chunks"`
	TransferredBytes int64 `json:"transferredBytes"`
	WireBytes        int64 `json:"wireBytes"`
	ZeroBytes        int64 `json:"zeroBytes"`
}

// stream readies the checkpoint at loc for a restore that streams its memory (see
// chunked.Stage): r gets the fetched directory and the store's memory. Close what it returns
// once the restore is done.
func (a *app) stream(ctx context.Context, loc string, trust signing.Keys, r *engine.RestoreRequest) (*streamedRestore, error) {
	st, prefix, err := store.Open(ctx, loc, a.cfg.s3)
	if err != nil {
		return nil, classifyStore(err)
	}
	start := time.Now()
	// Journaled before anything is fetched: a gpucr killed while fetching leaves the files
	// to the next one's recovery.
	staging, err := engine.NewStagingDir(a.runDir, "restore --from "+st.URL(prefix), "gpucr-stream-")
	if err != nil {
		return nil, classify(err)
	}
	s, err := chunked.Stage(ctx, st, prefix, staging.Dir, chunked.Options{Trust: trust})
	if err != nil {
		return nil, classifyStore(errors.Join(err, staging.Close()))
	}
	r.Dir, r.Streamed = s.Dir, &engine.Streamed{Memory: s.Memory, Owned: []string{staging.Dir}, Room: s.Bound - s.Local}
	return &streamedRestore{Staged: s, staging: staging, url: st.URL(prefix), took: time.Since(start)}, nil
}

// streamedRestore is a restore --from in progress.
type streamedRestore struct {
	*chunked.Staged
	staging *engine.StagingDir
	url     string
	took    time.Duration
}

// Close removes the fetched files and their record.
func (s *streamedRestore) Close() error {
	s.Staged.Close()
	return s.staging.Close()
}

func (s *streamedRestore) output() *streamOutput {
	m := s.Memory.Stats()
	return &streamOutput{URL: s.url, FetchedFiles: s.Stats.Files, FetchedBytes: s.Stats.Bytes, FetchSeconds: s.took.Seconds(),
		LocalBound: s.Bound, MemoryBytes: m.Bytes, Chunks: m.Transferred, TransferredBytes: m.TransferredBytes,
		WireBytes: m.WireBytes, ZeroBytes: m.ZeroBytes}
}

func printStream(a *app, s *streamOutput) {
	fmt.Fprintf(a.stdout, "streamed %s: %d files (%s) fetched in %.2fs, %s of memory filled from the store (%d chunks, %s downloaded; %s of zeros)\n",
		s.URL, s.FetchedFiles, bytesHuman(uint64(s.FetchedBytes)), s.FetchSeconds, bytesHuman(uint64(s.MemoryBytes)),
		s.Chunks, bytesHuman(uint64(s.WireBytes)), bytesHuman(uint64(s.ZeroBytes)))
}
