package chunked

import (
	"context"

	"github.com/gpucr/gpucr/internal/parallel"
)

// buffers are one worker's chunk buffers, reused from chunk to chunk so that memory stays
// at two chunks per worker whatever the image's size.
type buffers struct {
	raw, comp []byte
	check     []byte // a stored chunk read back, decoded (uploader.intact)
}

// runJobs runs do for every job on n workers, each with its own buffers; the first error
// stops the rest and is returned.
func runJobs(ctx context.Context, jobs []job, n int, do func(context.Context, job, *buffers) error) error {
	return parallel.Each(ctx, jobs, n, func() *buffers { return &buffers{raw: make([]byte, ChunkSize)} }, do)
}
