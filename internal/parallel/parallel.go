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

// Interleave lists the first item of every list, then the second of every list, and so on.
// Workers taking jobs in that order from lists of pieces of different files write to
// different files side by side: on tmpfs, writers of one file queue on its inode lock.
func Interleave[J any](lists [][]J) []J {
	var out []J
	for k := 0; ; k++ {
		n := len(out)
		for _, l := range lists {
			if k < len(l) {
				out = append(out, l[k])
			}
		}
		if len(out) == n {
			return out
		}
	}
}
