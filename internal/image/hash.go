package image

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
)

// hashBufSize is large so that page files of tens of GB stream in few read calls.
const hashBufSize = 4 << 20

// sumFiles sizes and hashes paths (slash, relative to dir) on all cores and returns them
// in the order of paths. Commit and Verify share it so that both compute the same thing.
// With durable, each file is also fsynced while open, so that Commit's flush runs in
// parallel too. After the first error no new file is started; the error of the first
// failed path is returned.
func sumFiles(dir string, paths []string, durable bool) ([]File, error) {
	out := make([]File, len(paths))
	errs := make([]error, len(paths))
	work := make(chan int)
	var failed atomic.Bool
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(paths)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, hashBufSize)
			for i := range work {
				if failed.Load() {
					continue
				}
				if out[i], errs[i] = sumFile(dir, paths[i], buf, durable); errs[i] != nil {
					failed.Store(true)
				}
			}
		}()
	}
	for i := range paths {
		work <- i
	}
	close(work)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

func sumFile(dir, p string, buf []byte, durable bool) (File, error) {
	f, err := os.Open(filepath.Join(dir, filepath.FromSlash(p)))
	if err != nil {
		return File{}, fmt.Errorf("checksum %s: %w", p, err)
	}
	defer f.Close()
	h := xxhash.New()
	// Hide f's WriterTo so that CopyBuffer uses buf instead of its own small one.
	n, err := io.CopyBuffer(h, struct{ io.Reader }{f}, buf)
	if err != nil {
		return File{}, fmt.Errorf("checksum %s: %w", p, err)
	}
	if durable {
		if err := f.Sync(); err != nil {
			return File{}, fmt.Errorf("sync %s: %w", p, err)
		}
	}
	return File{Path: p, Size: n, XXH64: fmt.Sprintf("%016x", h.Sum64())}, nil
}
