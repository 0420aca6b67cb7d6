package chunked

import (
	"context"
	"sync"
)

// buffers are one worker's chunk buffers, reused from chunk to chunk so that memory stays
// at two chunks per worker whatever the image's size.
type buffers struct {
	raw, comp []byte
}

// runJobs runs do for every job on n workers. The first error cancels the jobs not yet
// started and the context of those running, and is returned.
func runJobs(ctx context.Context, jobs []job, n int, do func(context.Context, job, *buffers) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	work := make(chan job)
	var wg sync.WaitGroup
	for range min(n, len(jobs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := &buffers{raw: make([]byte, ChunkSize)}
			for j := range work {
				if err := do(ctx, j, buf); err != nil {
					cancel(err)
				}
			}
		}()
	}
feed:
	for _, j := range jobs {
		select {
		case work <- j:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	return context.Cause(ctx)
}
