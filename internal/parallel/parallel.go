// Package parallel runs a list of jobs on a fixed number of workers, each with state of its
// own (a buffer, say), and stops at the first error.
package parallel

import (
	"context"
	"sync"
)

// Each runs do for every job on n workers; each worker gets one state from newState and
// keeps it. The first error cancels the jobs not yet started and the context of those
// running, and is returned.
func Each[J, S any](ctx context.Context, jobs []J, n int, newState func() S, do func(context.Context, J, S) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	work := make(chan J)
	var wg sync.WaitGroup
	for range min(n, len(jobs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			state := newState()
			for j := range work {
				if err := do(ctx, j, state); err != nil {
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
