package chunked

import (
	"fmt"
	"path/filepath"

	"github.com/gpucr/gpucr/internal/criuimg"
	"github.com/gpucr/gpucr/internal/image"
)

// pageCuts returns, for each pages-<id>.img of a CRIU image, where its chunks end. CRIU
// writes the pages of a process back to back in address order, so a page's offset in the
// file moves whenever any run of pages before it grows or shrinks, as a heap does between
// two checkpoints; chunks cut at fixed file offsets would then all differ. Cutting instead
// where the pages' virtual address crosses a ChunkSize boundary makes a chunk the pages of
// one aligned window of address space, which is the same bytes in the next checkpoint
// when that memory did not change. Files whose pagemap cannot be read, or does not account
// for the file's size exactly, are left out and get fixed-size chunks.
func pageCuts(dir string, files []File) map[string][]int64 {
	sizes := map[string]int64{}
	var largest int64
	for _, f := range files {
		sizes[f.Path] = f.Size
		largest = max(largest, f.Size)
	}
	maps, _ := filepath.Glob(filepath.Join(dir, image.CRIUDir, criuimg.PagemapGlob))
	cuts := map[string][]int64{}
	for _, m := range maps {
		id, ends, err := chunkEnds(m, largest)
		if err != nil {
			continue
		}
		name := image.CRIUDir + "/" + criuimg.PagesName(id)
		if size, ok := sizes[name]; ok && (len(ends) == 0 && size == 0 || len(ends) > 0 && ends[len(ends)-1] == size) {
			cuts[name] = ends
		}
	}
	return cuts
}

// chunkEnds returns the pages id of a pagemap image and the file offsets at which the
// chunks of its pages file end. The present pages must add up to limit bytes at most: the
// pagemap comes from the image, and each of its entries can claim 16 TiB of pages, which
// would otherwise be walked page by page.
func chunkEnds(path string, limit int64) (uint32, []int64, error) {
	pm, err := criuimg.ReadPagemap(path)
	if err != nil {
		return 0, nil, err
	}
	var (
		ends   []int64
		off    int64
		window = int64(-1)
	)
	for _, e := range pm.Entries {
		if !criuimg.Present(e) {
			continue
		}
		if int64(e.GetNrPages())*criuimg.PageSize > limit-off {
			return 0, nil, fmt.Errorf("%s: its pages add up to more than %d bytes", path, limit)
		}
		for p := range int64(e.GetNrPages()) {
			w := (int64(e.GetVaddr()) + p*criuimg.PageSize) / ChunkSize
			if w != window && off > 0 {
				ends = append(ends, off)
			}
			window = w
			off += criuimg.PageSize
		}
	}
	if off > 0 {
		ends = append(ends, off)
	}
	return pm.Head.GetPagesId(), ends, nil
}
